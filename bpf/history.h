/* Get/put history (--history: knob `history`, or `history_all`): each traced
 * object of the chosen types keeps its first operations with their stacks, and
 * the exact count of its operations at each path; per process and type, every
 * operation at each path of objects with history (released ones too): the
 * baseline that attribution compares a leaked object's paths with.
 *
 * Sizes (-D): MAX_HISTORY, MAX_SITES, MAX_PATHS; the entries kept per object,
 * knob `history_depth`, size the values of `history` and `hist_zero`.
 */
#ifndef REFCNTD_HISTORY_H
#define REFCNTD_HISTORY_H

BPF_F_TABLE("hash", struct obj_key, struct hist_val, history, MAX_HISTORY, BPF_F_NO_PREALLOC);
/* A zero hist_val to start a history from: memset of a large struct is not
 * inlined by LLVM (it aborts the whole process at --history-depth >= 32). */
BPF_ARRAY(hist_zero, struct hist_val, 1);
BPF_HASH(released_sites, struct site_key, __u64, MAX_SITES);
BPF_F_TABLE("hash", struct path_key, struct path_val, hist_paths, MAX_PATHS, BPF_F_NO_PREALLOC);
BPF_HASH(history_types, __u32, __u32, 256);

static __always_inline void hist_start(struct obj_key *key, __u32 type_id, __u64 serial)
{
	struct refcntd_config *c = knobs();
	__u32 zero = 0;
	if (!c || !c->history)
		return;
	if (!c->history_all && type_id && !history_types.lookup(&type_id))
		return;  /* an unread type name (0) keeps history: filtered when shown */
	struct hist_val *blank = hist_zero.lookup(&zero);  /* never written: all zero */
	if (!blank)
		return;
	if (history.update(key, blank) != 0) {
		stat_count(ST_HISTORY_MAP_FULL);
		return;
	}
	struct hist_val *h = history.lookup(key);
	if (h)
		h->serial = serial;
}

/* Exact count of this object's operations at this path, in hist_paths. */
static __always_inline void hist_count_path(struct hist_val *h, struct obj_key *key, __u32 op,
					    struct hist_entry *e)
{
	struct path_key k = {.tgid = key->tgid, .op = op, .addr = key->addr, .serial = h->serial,
			     .stack_id = e->stack_id, .caller_ip = e->caller_ip};
	struct path_val *v = hist_paths.lookup(&k);
	if (!v) {
		struct path_val first = {.count = 1, .first_ns = e->ts, .last_ns = e->ts};
		if (hist_paths.insert(&k, &first) == 0) {
			__u64 i = __sync_fetch_and_add(&h->npaths, 1);
			if (i < HISTORY_SITES) {
				struct hist_path p = {.op = op, .stack_id = e->stack_id,
						      .caller_ip = e->caller_ip};
				h->path[i & (HISTORY_SITES - 1)] = p;
			}
			return;
		}
		v = hist_paths.lookup(&k);  /* another CPU inserted it first */
		if (!v) {
			stat_count(ST_PATHS_MAP_FULL);
			__sync_fetch_and_add(&h->paths_lost, 1);
			return;
		}
	}
	__sync_fetch_and_add(&v->count, 1);
	v->last_ns = e->ts;
}

/* Every operation at this path of this process's objects of this type. */
static __always_inline void hist_count_type_path(struct obj_key *key, struct obj_val *o,
						 __u32 op, struct hist_entry *e)
{
	struct site_key k = {.tgid = key->tgid, .type_id = o->type_id, .op = op,
			     .stack_id = e->stack_id, .caller_ip = e->caller_ip,
			     .name_ptr = o->type_id ? 0 : o->name_ptr};
	__u64 zero = 0;
	__u64 *total = released_sites.lookup_or_try_init(&k, &zero);
	if (total)
		__sync_fetch_and_add(total, 1);
	else
		stat_count(ST_SITES_MAP_FULL);
}

/* One operation of an object with history, with its stack (capture_stacks);
 * `o`: the object's record, which names its type (no lookup of its own). */
static __always_inline void hist_record(struct pt_regs *ctx, struct probe_cfg *cfg,
					struct obj_key *key, struct obj_val *o, __u32 op,
					__s64 count_after)
{
	struct refcntd_config *c = knobs();
	struct hist_val *h = c && c->history ? history.lookup(key) : 0;
	if (!h)
		return;
	struct hist_entry e = {.op = op, .count_after = count_after, .ts = bpf_ktime_get_ns()};
	capture_stacks(ctx, cfg, &e.stack_id, &e.caller_ip, 0);  /* needs_stack: always */
	hist_count_path(h, key, op, &e);
	hist_count_type_path(key, o, op, &e);
	__u64 i = __sync_fetch_and_add(&h->n, 1);
	__u32 depth = c->history_depth;  /* the map's values hold this many entries */
	if (i < depth)
		h->e[i & (depth - 1)] = e;
}

/* A released object's paths are dropped: released_sites already counted them. */
static __always_inline void hist_fold(struct obj_key *key)
{
	struct hist_val *h = KNOB(history) ? history.lookup(key) : 0;
	if (!h)
		return;
#pragma unroll
	for (int i = 0; i < HISTORY_SITES; i++) {
		if (i >= h->npaths)
			break;
		struct hist_path *p = &h->path[i];
		struct path_key k = {.tgid = key->tgid, .op = p->op, .addr = key->addr,
				     .serial = h->serial, .stack_id = p->stack_id,
				     .caller_ip = p->caller_ip};
		hist_paths.delete(&k);
	}
	if (h->npaths > HISTORY_SITES)
		stat_count(ST_PATHS_STALE);
	history.delete(key);
}

#endif
