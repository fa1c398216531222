/* The executable mappings of each traced process, for the CFI walk (unwind.h)
 * and for holding (hold.h): which module a pc is in, at which file offset.
 *
 * Kept here from exec, mmap(PROT_EXEC), mprotect and munmap, so they are right
 * for a process that lives a few milliseconds and across dlopen/dlclose: a
 * /proc/PID/maps snapshot loses that race.  Files are named by inode and
 * device, read at the kernel struct offsets the configuration carries (BTF).
 * All of it runs only with knob `unwind`.
 */
#ifndef REFCNTD_EXECMAPS_H
#define REFCNTD_EXECMAPS_H

#ifndef PROT_EXEC
#define PROT_EXEC 0x4
#endif
#ifndef MAP_ANONYMOUS
#define MAP_ANONYMOUS 0x20
#endif
#define SYSCALL_ERR_MIN ((__u64)-4096)  /* a syscall return at or above this is -errno */
#ifndef MAX_MMAP_CALLS
#define MAX_MMAP_CALLS 4096
#endif

BPF_F_TABLE("hash", __u32, struct exec_maps, exec_maps, MAX_PROCS, BPF_F_NO_PREALLOC);
BPF_HASH(pending_mmap, __u32, struct mmap_args, MAX_MMAP_CALLS);  /* by thread, in the syscall */
BPF_PERCPU_ARRAY(maps_scratch, struct exec_maps, 1);

static __always_inline __u64 maps_kread(__u64 addr)
{
	__u64 value = 0;
	if (addr)
		bpf_probe_read_kernel(&value, sizeof(value), (void *)addr);
	return value;
}

static __always_inline void maps_file_identity(struct refcntd_config *c, __u64 file,
					       struct file_key *key)
{
	__u64 inode = maps_kread(file + c->off_file_inode);
	key->ino = maps_kread(inode + c->off_inode_ino);
	key->dev = (__u32)maps_kread(maps_kread(inode + c->off_inode_sb) + c->off_sb_dev);
	key->pad = 0;
}

/* Copies the mapping holding pc into *out; 0 when there is none.  Results
 * leave the loops as copies, never as indexes, so the verifier can prune
 * the states of different iterations (it explores each loop exit apart). */
static __always_inline int maps_find(struct exec_maps *maps, __u64 pc, struct exec_map *out)
{
	if (pc >= out->start && pc < out->end)  /* the previous frame's mapping */
		return 1;
	int found = 0;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {
		bounded(i);
		if (i >= maps->n)
			break;
		if (pc >= maps->m[i].start && pc < maps->m[i].end) {
			__builtin_memcpy(out, &maps->m[i], sizeof(*out));
			found = 1;
			break;
		}
	}
	return found;
}

/* The file offset of pc in mapping m (the executable's text mapping records
 * EXE_PGOFF: its offset is the text's, from the module's table). */
static __always_inline __u64 maps_file_offset(struct exec_map *m, struct cfi_module *mod,
					      __u64 pc)
{
	__u64 pgoff = m->pgoff == EXE_PGOFF ? (mod ? mod->text_off : 0) : m->pgoff;
	return pc - m->start + pgoff;
}

static __always_inline void maps_add(__u32 tgid, __u64 start, __u64 end, __u64 pgoff,
				     struct file_key *file)
{
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	if (!maps) {
		int zero = 0;
		struct exec_maps *blank = maps_scratch.lookup(&zero);
		if (!blank)
			return;
		blank->n = 0;
		exec_maps.update(&tgid, blank);
		maps = exec_maps.lookup(&tgid);
		if (!maps)
			return;
	}
	__u32 slot = maps->n;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {  /* MAP_FIXED over an old mapping */
		bounded(i);
		if (i >= maps->n)
			break;
		if (maps->m[i].start < end && start < maps->m[i].end) {
			slot = i;
			break;
		}
	}
	if (slot >= MAX_EXEC_MAPS) {
		stat_count(ST_EXEC_MAPS_FULL);
		return;
	}
	maps->m[slot].start = start;
	maps->m[slot].end = end;
	maps->m[slot].pgoff = pgoff;
	maps->m[slot].file = *file;
	if (slot == maps->n)
		maps->n = slot + 1;
}

/* A fork copies the parent's mappings; a thread's copy made at its clone, or a
 * process, goes at its exit. */
static __always_inline void maps_fork(__u32 parent, __u32 child)
{
	if (!KNOB(unwind))
		return;
	struct exec_maps *maps = exec_maps.lookup(&parent);
	if (maps)
		exec_maps.update(&child, maps);
}

static __always_inline void maps_exit(__u32 tgid)
{
	if (KNOB(unwind))
		exec_maps.delete(&tgid);
}

/* In hold.h (it stops the process): see the comment there. */
static __always_inline void hold_if_unvetted(__u32 tgid, struct file_key *file, int exec);

TRACEPOINT_PROBE(sched, sched_process_exec)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct refcntd_config *c = knobs();
	if (!c || !c->unwind || !proc_tracked(tgid))
		return 0;
	exec_maps.delete(&tgid);
	__u64 mm = maps_kread(bpf_get_current_task() + c->off_task_mm);
	struct file_key file = {};
	maps_file_identity(c, maps_kread(mm + c->off_mm_exe_file), &file);
	maps_add(tgid, maps_kread(mm + c->off_mm_start_code), maps_kread(mm + c->off_mm_end_code),
		 EXE_PGOFF, &file);
	hold_if_unvetted(tgid, &file, 1);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
	__u64 id = bpf_get_current_pid_tgid();
	/* PROT_EXEC, of a file or anonymous (MAP_ANONYMOUS: JIT code) */
	if (!(args->prot & PROT_EXEC) || ((int)args->fd < 0 && !(args->flags & MAP_ANONYMOUS)) ||
	    !KNOB(unwind) || !proc_tracked(id >> 32))
		return 0;
	struct mmap_args a = {.len = args->len, .off = args->off, .fd = args->fd};
	__u32 tid = (__u32)id;
	pending_mmap.update(&tid, &a);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct refcntd_config *c = knobs();
	struct mmap_args *a = c && c->unwind ? pending_mmap.lookup(&tid) : 0;
	if (!a)
		return 0;
	struct mmap_args saved = *a;
	pending_mmap.delete(&tid);
	if (args->ret < 0 || (__u64)args->ret >= SYSCALL_ERR_MIN)
		return 0;
	struct file_key file = {};  /* all zero: anonymous */
	if (saved.fd >= 0) {
		__u64 files = maps_kread(bpf_get_current_task() + c->off_task_files);
		__u64 fds = maps_kread(maps_kread(files + c->off_files_fdt) + c->off_fdt_fd);
		maps_file_identity(c, maps_kread(fds + sizeof(__u64) * (__u64)(__u32)saved.fd),
				   &file);
	}
	maps_add(id >> 32, args->ret, args->ret + saved.len, saved.fd >= 0 ? saved.off : 0, &file);
	if (saved.fd >= 0)
		hold_if_unvetted(id >> 32, &file, 0);
	return 0;
}

/* W^X JITs write code, then mprotect it executable: followed like an anonymous
 * mmap(PROT_EXEC), unless a mapping already covers it (a file's text). */
TRACEPOINT_PROBE(syscalls, sys_enter_mprotect)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!(args->prot & PROT_EXEC) || !KNOB(unwind) || !proc_tracked(tgid))
		return 0;
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	struct exec_map seen = {};
	if (maps && maps_find(maps, args->start, &seen))
		return 0;
	struct file_key anon = {};
	maps_add(tgid, args->start, args->start + args->len, 0, &anon);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct exec_maps *maps = KNOB(unwind) ? exec_maps.lookup(&tgid) : 0;
	if (!maps)
		return 0;
	__u64 start = args->addr, end = args->addr + args->len;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {  /* dlclose: forget what it unmaps */
		bounded(i);
		if (i >= maps->n)
			break;
		if (maps->m[i].start >= start && maps->m[i].end <= end)
			maps->m[i].end = maps->m[i].start;  /* empty: never matches */
	}
	return 0;
}

#endif
