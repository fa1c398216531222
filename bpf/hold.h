/* Holding processes for exported functions probed at their call sites (knob
 * `hold`, which needs `unwind`'s mapping hooks, execmaps.h).
 *
 * Such a function is only counted exactly if every module that calls it has its
 * call sites probed before its code runs.  A process that maps (or execs) a
 * module nobody has scanned, while it maps a module defining such a function, is
 * stopped before the mmap or exec returns; user space (session/vetting.py) scans
 * the module, probes its calls (or moves the function back to its entry probe)
 * and continues it.
 *
 * Sizes (-D): MAX_VETTED, MAX_HELD.
 */
#ifndef REFCNTD_HOLD_H
#define REFCNTD_HOLD_H

#ifndef SIGSTOP
#define SIGSTOP 19
#endif
#ifndef MAX_VETTED
#define MAX_VETTED 65536
#endif
BPF_HASH(vetted, struct file_key, __u32, MAX_VETTED);  /* modules user space has scanned */
BPF_HASH(hold_owners, struct file_key, __u32, 64);      /* modules defining such functions */
BPF_HASH(held, __u32, struct hold_key, MAX_HELD);       /* stopped, waiting for a scan */
BPF_HASH(hold_funcs, struct hold_key, __u32, 256);      /* the functions themselves */

static __always_inline void hold_stop(__u32 tgid, struct hold_key *why)
{
	held.update(&tgid, why);
	struct event *ev = event_new(EV_HOLD, tgid, (__u32)bpf_get_current_pid_tgid(), 0);
	if (ev)
		event_emit(ev);
	bpf_send_signal(SIGSTOP);  /* the whole process, before it returns to user space */
}

/* The module that was mapped first is also caught: the check covers every
 * mapping of the process. */
static __always_inline void hold_if_unvetted(__u32 tgid, struct file_key *file)
{
	if (!KNOB(hold))
		return;
	int owner = hold_owners.lookup(file) != 0;
	int unvetted = (file->ino || file->dev) && !vetted.lookup(file);
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	if (maps) {
		for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {
			bounded(i);
			if (i >= maps->n)
				break;
			struct file_key key = maps->m[i].file;
			if (!key.ino && !key.dev)
				continue;
			if (hold_owners.lookup(&key))
				owner = 1;
			if (!vetted.lookup(&key))
				unvetted = 1;
		}
	}
	if (!owner || !unvetted)
		return;
	struct hold_key why = {.file = *file};
	hold_stop(tgid, &why);
}

/* dlsym()/dlvsym() returning such a function's address: it will be called
 * through a pointer, past every call-site probe.  The process stops before
 * the caller sees the address, and user space moves the function back to its
 * entry probe. */
int on_dlsym_return(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 addr = PT_REGS_RC(ctx);
	struct exec_maps *maps = addr && KNOB(hold) && proc_tracked(tgid)
				 ? exec_maps.lookup(&tgid) : 0;
	if (!maps)
		return 0;
	struct exec_map m = {};
	if (!maps_find(maps, addr, &m))
		return 0;
	struct hold_key key = {.file = m.file,
			       .offset = maps_file_offset(&m, cfi_modules.lookup(&m.file), addr)};
	if (hold_funcs.lookup(&key))
		hold_stop(tgid, &key);
	return 0;
}

#endif
