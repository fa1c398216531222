/* Misuse caught at the offending operation (enum refcntd_anomaly): sent at once
 * through the ring buffer, with the offending stack and what is known of the
 * object (its allocation, when it was released).
 */
#ifndef REFCNTD_ANOMALY_H
#define REFCNTD_ANOMALY_H

BPF_PERCPU_ARRAY(anomaly_buf, struct anomaly, 1);

/* Report misuse of `key` with the offending stack; `g` describes the object
 * (obj_describe() of a live one, its graveyard entry), all zero if never seen.
 * Each role calls it once: every inlined copy holds a stack walk, and the
 * copies made most of the compile's time. */
static __always_inline void anomaly_report(struct pt_regs *ctx, struct probe_cfg *cfg,
					  __u32 kind, struct obj_key *key, __s64 count_before,
					  struct grave_val *g)
{
	int zero = 0;
	struct anomaly *a = anomaly_buf.lookup(&zero);
	if (!a)
		return;
	__builtin_memset(a, 0, sizeof(*a));
	a->kind = EV_ANOMALY;
	a->tgid = key->tgid;
	a->tid = (__u32)bpf_get_current_pid_tgid();
	a->anomaly = kind;
	a->ts = bpf_ktime_get_ns();
	a->addr = key->addr;
	a->count_before = count_before;
	capture_stacks(ctx, cfg, &a->stack_id, &a->caller_ip, 1);
	a->type_id = g->type_id;
	a->gen = g->gen;
	a->alloc_stack_id = g->stack_id;
	a->alloc_caller_ip = g->caller_ip;
	a->name_ptr = g->name_ptr;
	a->init_ns = g->init_ns;
	a->released_ns = g->released_ns;
	if (events.ringbuf_output(a, sizeof(*a), 0) != 0)
		stat_count(ST_EVENT_LOST);
}

/* An operation on an object not in `objs`: after its delete (`after_delete`, *g its
 * graveyard entry), or never seen (`unknown`; each never-seen object is reported
 * once, all are counted).  The anomaly to report, 0 for none. */
static __always_inline __u32 anomaly_missing(struct probe_cfg *cfg, struct obj_key *key,
					     __u32 after_delete, __u32 unknown, int unknown_stat,
					     struct grave_val *g)
{
	struct grave_val *grave = graveyard.lookup(key);
	if (grave) {
		*g = *grave;
		return after_delete;
	}
	if (may_leak.lookup(key))
		return 0;
	struct proc_val *proc = procs.lookup(&key->tgid);
	if (proc ? (proc->flags & PROC_IGNORED) : (KNOB(filtered) || !proc_allowed()))
		return 0;  /* not this tracer's process (system-wide: registered at its init) */
	stat_count(unknown_stat);
	__u32 one = 1;
	if ((cfg->flags & PF_QUIET_UNKNOWN) || unknown_seen.lookup(key))
		return 0;
	unknown_seen.update(key, &one);
	return unknown;
}

#endif
