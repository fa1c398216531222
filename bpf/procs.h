/* The traced processes: one entry per process (its generation, so a reused pid
 * never shares records, and whether filters left it out), registered by run's
 * user space, at a traced parent's fork, or system-wide at its first init.
 * The process tracepoints themselves are in refcntd.c.
 */
#ifndef REFCNTD_PROCS_H
#define REFCNTD_PROCS_H

BPF_HASH(procs, __u32, struct proc_val, MAX_PROCS);
BPF_HASH(comm_allow, struct comm_key, __u32, 64);
/* serve: the (dev, inode) of the programs a target's path names (knob filter_exe) */
BPF_HASH(exe_allow, struct file_key, __u32, 64);
BPF_ARRAY(gen_counter, __u64, 1);
/* fork without exec: a traced child's parent, so that the child's first
 * operation on an object it inherited finds the parent's (obj_inherit). */
BPF_TABLE("lru_hash", __u32, __u32, fork_parent, MAX_PROCS);

static __always_inline __u64 proc_kread(__u64 addr)
{
	__u64 value = 0;
	if (addr)
		bpf_probe_read_kernel(&value, sizeof(value), (void *)addr);
	return value;
}

/* Whether the current process runs one of the programs in exe_allow: a library
 * every process maps (libgstreamer) is probed for all of them, and a target whose
 * path is a program traces only the processes running it. */
static __always_inline int proc_exe_allowed(struct refcntd_config *c)
{
	__u64 mm = proc_kread(bpf_get_current_task() + c->off_task_mm);
	__u64 file = mm ? proc_kread(mm + c->off_mm_exe_file) : 0;
	__u64 inode = file ? proc_kread(file + c->off_file_inode) : 0;
	if (!inode)
		return 0;
	struct file_key key = {};
	key.ino = proc_kread(inode + c->off_inode_ino);
	key.dev = (__u32)proc_kread(proc_kread(inode + c->off_inode_sb) + c->off_sb_dev);
	return exe_allow.lookup(&key) != 0;
}

/* Whether this process counts: run and --pid trace only the registered ones;
 * system-wide with a program filter, those not ignored (not registered yet: those
 * running the program).  `tgid` is the current process. */
static __always_inline int proc_tracked(__u32 tgid)
{
	if (!KNOB(filtered) && !KNOB(filter_exe))
		return 1;
	struct proc_val *p = procs.lookup(&tgid);
	if (KNOB(filtered) || p)
		return p && !(p->flags & PROC_IGNORED);
	struct refcntd_config *c = knobs();
	return c && proc_exe_allowed(c);
}

/* Whether a process found system-wide passes the target's program, comm and cgroup
 * filters. */
static __always_inline int proc_allowed(void)
{
	struct refcntd_config *c = knobs();
	if (!c)
		return 1;
	if (c->filter_exe && !proc_exe_allowed(c))
		return 0;
	if (c->cgroup_id && bpf_get_current_cgroup_id() != c->cgroup_id)
		return 0;
	if (c->filter_comm) {
		struct comm_key key = {};
		bpf_get_current_comm(key.comm, sizeof(key.comm));
		if (!comm_allow.lookup(&key))
			return 0;
	}
	return 1;
}

/* A new entry for tgid (EV_PROC: found system-wide, EV_FORK: a traced parent's
 * child), announced to user space unless the filters leave it out. */
static __always_inline struct proc_val *proc_register(__u32 tgid, __u32 kind, __u32 pid)
{
	int zero = 0;
	__u64 *counter = gen_counter.lookup(&zero);
	if (!counter)
		return 0;
	struct proc_val p = {};
	p.gen = __sync_fetch_and_add(counter, 1) + 1;
	p.start_ns = bpf_ktime_get_ns();
	if (kind == EV_PROC && !proc_allowed())
		p.flags = PROC_IGNORED;
	if (procs.update(&tgid, &p) != 0) {
		stat_count(ST_PROC_MAP_FULL);
		return 0;
	}
	if (!(p.flags & PROC_IGNORED)) {
		struct event *ev = event_new(kind, tgid, pid, p.gen);
		if (ev)
			event_emit(ev);
	}
	return procs.lookup(&tgid);
}

#endif
