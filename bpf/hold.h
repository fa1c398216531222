/* Holding processes until user space has caught up (knob `hold`, which needs
 * `unwind`'s mapping hooks, execmaps.h), for two reasons:
 *
 * - Exported functions probed at their call sites: such a function is only
 *   counted exactly if every module that calls it has its call sites probed
 *   before its code runs.  A process that maps (or execs) a module nobody has
 *   scanned, while it maps a module defining such a function, is stopped.
 * - Unwind tables (knob `hold_tables`): a process that maps a probed module
 *   while one of its modules has no table in cfi_modules yet would have its
 *   first stacks cut there (a program exec'd after attach, by a script, ...).
 *
 * The process is stopped before the mmap or exec returns, so none of that
 * module's code has run; user space (session/vetting.py) loads the tables,
 * scans the module and probes its calls (or moves the function back to its
 * entry probe), and continues it.  A module is held for once: user space gives
 * every file it tried a cfi_modules entry, an empty one when it has no table.
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
BPF_HASH(table_owners, struct file_key, __u32, 64);     /* probed modules (hold_tables) */

static __always_inline void hold_stop(__u32 tgid, struct hold_key *why)
{
	held.update(&tgid, why);
	struct event *ev = event_new(EV_HOLD, tgid, (__u32)bpf_get_current_pid_tgid(), 0);
	if (ev)
		event_emit(ev);
	bpf_send_signal(SIGSTOP);  /* the whole process, before it returns to user space */
}

/* Whether one of the process's file mappings is (`owner`) a module that is a
 * reason to hold, or (!`owner`) one user space has not caught up on, for one
 * reason (`tables`, as below).  `tables` and `owner` are constants at each
 * call, and the loop carries no flag: it leaves at the first hit, so the
 * verifier walks each iteration once (one loop tracking two flags had 4 states
 * per iteration: 116 000 instructions and ~0.5 s of verification per start). */
static __always_inline int hold_any(struct exec_maps *maps, int tables, int owner)
{
	for (__u32 i = 0; maps && i < MAX_EXEC_MAPS; i++) {
		bounded(i);
		if (i >= maps->n)
			break;
		struct file_key key = maps->m[i].file;
		if (!key.ino && !key.dev)
			continue;
		void *hit = owner ? (tables ? (void *)table_owners.lookup(&key)
					    : (void *)hold_owners.lookup(&key))
				  : (tables ? (void *)cfi_modules.lookup(&key)
					    : (void *)vetted.lookup(&key));
		if (owner ? hit != 0 : hit == 0)
			return 1;
	}
	return 0;
}

/* Whether the process must wait for user space, for one reason (`tables` is a
 * constant at each call):
 * - 0: `file`, or another of its mappings, defines an exported function probed
 *   at its call sites while one of them was never scanned (vetted);
 * - 1: one of them is a probed module while one has no unwind table (not even
 *   an empty entry) in cfi_modules yet. */
static __always_inline int hold_needed(struct exec_maps *maps, struct file_key *file,
				       int tables)
{
	int owner = (tables ? table_owners.lookup(file) : hold_owners.lookup(file)) != 0;
	if (!owner && !hold_any(maps, tables, 1))
		return 0;
	int missing = (file->ino || file->dev) &&
		      !(tables ? (void *)cfi_modules.lookup(file) : (void *)vetted.lookup(file));
	return missing || hold_any(maps, tables, 0);
}

/* The module that was mapped first is also caught: the checks cover every
 * mapping of the process.  `exec`: `file` is the program the process has just
 * exec'd; with knob hold_execs one nobody scanned stops it by itself (user
 * space probes its own copy of the spec's functions, if it has one). */
static __always_inline void hold_if_unvetted(__u32 tgid, struct file_key *file, int exec)
{
	if (!KNOB(hold))
		return;
	int new_program = exec && KNOB(hold_execs) && (file->ino || file->dev) &&
			  !vetted.lookup(file);
	if (!new_program) {
		struct exec_maps *maps = exec_maps.lookup(&tgid);
		if (!hold_needed(maps, file, 0) &&
		    !(KNOB(hold_tables) && hold_needed(maps, file, 1)))
			return;
	}
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
