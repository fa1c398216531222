/* The counters of enum refcntd_stat: what could not be recorded ("loss:", the
 * run is incomplete) and what is worth a line ("note:").  Every report, the
 * metrics and tests/bpf/test_counters.py read them.
 *
 * Counted twice: in the totals, and for the current process, whose report
 * shows its own counts (whatever a process's probe or event loses happens in it).
 */
#ifndef REFCNTD_STATS_H
#define REFCNTD_STATS_H

#ifndef MAX_PROC_STATS
#define MAX_PROC_STATS 16384
#endif
BPF_PERCPU_ARRAY(stats, __u64, ST_COUNT);
BPF_HASH(proc_stats, struct proc_stat_key, __u64, MAX_PROC_STATS);

/* Counts `which` in the totals and for process `tgid`. */
static __always_inline void stat_count_of(__u32 tgid, int which)
{
	__u64 *v = stats.lookup(&which);
	if (v)
		*v += 1;
	struct proc_stat_key k = {.tgid = tgid, .stat = which};
	__u64 one = 1, *own = proc_stats.lookup(&k);
	if (own) {
		__sync_fetch_and_add(own, 1);
		return;
	}
	long err = proc_stats.insert(&k, &one);
	if (err == -EEXIST) {  /* another CPU added it first */
		own = proc_stats.lookup(&k);
		if (own)
			__sync_fetch_and_add(own, 1);
	} else if (err) {
		int full = ST_PROC_STATS_FULL;
		__u64 *f = stats.lookup(&full);
		if (f)
			*f += 1;
	}
}

static __always_inline void stat_count(int which)
{
	stat_count_of(bpf_get_current_pid_tgid() >> 32, which);
}

#endif
