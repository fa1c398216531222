/* The object table: every traced object's count, keyed by (tgid, address), and
 * what is remembered around it (released objects, objects never seen, objects
 * in construction, revived and inherited ones).  The roles that change counts
 * (do_init, do_get, ... in refcntd.c) are built from these.
 */
#ifndef REFCNTD_OBJECTS_H
#define REFCNTD_OBJECTS_H

#define INHERIT_LEVELS 4  /* parent, grandparent, ... */

BPF_F_TABLE("hash", struct obj_key, struct obj_val, objs, MAX_OBJECTS, BPF_F_NO_PREALLOC);
BPF_TABLE("lru_hash", struct obj_key, struct grave_val, graveyard, MAX_GRAVES);
BPF_TABLE("lru_hash", struct obj_key, __u32, unknown_seen, MAX_GRAVES);
/* Objects whose delete fired inside their last put, before its probe, or whose
 * put calls another put on them (PF_ABSORBS_PUT): that put, by this thread id,
 * is already counted.  An init at the address forgets it. */
BPF_TABLE("lru_hash", struct obj_key, __u32, put_due, MAX_PROCS);
/* Threads inside a constructor whose return probe has not fired yet, and the
 * references taken and dropped on not-yet-returned objects meanwhile (an
 * instance_init that refs itself): added to the count when it returns. */
BPF_HASH(ctor_depth, __u32, __u32, MAX_PROCS);
BPF_TABLE("lru_hash", struct obj_key, __s64, early_ops, MAX_PROCS);
/* Per thread, the object its last put released: a get on it from the same
 * thread (its dispose keeping it, PF_REVIVE) brings it back. */
BPF_TABLE("lru_hash", __u32, struct obj_key, last_released, MAX_PROCS);
/* Objects the library flags as expected to outlive it: no longer counted. */
BPF_TABLE("lru_hash", struct obj_key, __u32, may_leak, MAX_GRAVES);

/* What is remembered of an object: kept in the graveyard once it is released
 * (released_ns set), and what an anomaly says about it. */
static __always_inline struct grave_val obj_describe(struct obj_val *o, __u64 released_ns)
{
	struct grave_val g = {.type_id = o->type_id, .gen = o->gen, .stack_id = o->stack_id,
			      .caller_ip = o->caller_ip,
			      .name_ptr = o->name_ptr, .init_ns = o->init_ns,
			      .released_ns = released_ns};
	return g;
}

/* Without knob `sites` the totals are added when an object is released (cheaper
 * per operation; serve and attach, which read live objects' operations, have it). */
static __always_inline void obj_add_totals(struct obj_key *key, struct obj_val *o)
{
	if (KNOB(sites)) {
		site_count_op(key, o, OP_RELEASED);
		return;
	}
	struct type_totals *t = type_totals_of(o->type_id);
	if (!t)
		return;
	t->inits += 1;
	t->gets += o->gets;
	t->puts += o->puts;
	t->released += 1;
}

static __always_inline void obj_release(struct obj_key *key, struct obj_val *o)
{
	struct grave_val g = obj_describe(o, bpf_ktime_get_ns());
	graveyard.update(key, &g);
	obj_add_totals(key, o);
	site_add(key, o, -1, 0);
	hist_fold(key);
	objs.delete(key);
}

/* An operation on an object not in `objs` while this thread is inside a
 * constructor: most likely the object being built; kept for its init. */
static __always_inline int obj_early_op(struct obj_key *key, __s64 delta)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 *depth = ctor_depth.lookup(&tid);
	if (!depth || !*depth)
		return 0;
	__s64 zero = 0;
	__s64 *ops = early_ops.lookup_or_try_init(key, &zero);
	if (ops)
		__sync_fetch_and_add(ops, delta);
	return 1;
}

/* A constructor returned: this thread is one level less inside constructors.
 * Returns the level it was at (0: not seen entering). */
static __always_inline __u32 obj_ctor_returned(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 *depth = ctor_depth.lookup(&tid);
	if (!depth)
		return 0;
	__u32 level = *depth;
	if (level > 1)
		*depth = level - 1;  /* only this thread writes its entry */
	else
		ctor_depth.delete(&tid);
	return level;
}

/* A library's static objects (a count of -1 that its ref/unref leave alone):
 * operations on them are not counted (PF_STATIC_IF). */
static __always_inline int obj_is_static(struct probe_cfg *cfg, __u64 addr)
{
	__s32 value = 0;
	if (!(cfg->flags & PF_STATIC_IF) ||
	    bpf_probe_read_user(&value, sizeof(value), (void *)(addr + cfg->static_offset)) != 0 ||
	    value != cfg->static_value)
		return 0;
	stat_count(ST_STATIC_SKIPPED);
	return 1;
}

/* An object the library flags "may be leaked": not counted any more, and later
 * operations on it pass.  By its probes (obj_set_aside), or by user space, which
 * read the flag in the process's memory at a scan (on_set_aside). */
static __always_inline void obj_put_aside(struct obj_key *key)
{
	__u32 one = 1;
	if (KNOB(sites)) {
		struct obj_val *o = objs.lookup(key);
		if (o)
			site_add(key, o, -1, 0);
	}
	objs.delete(key);
	may_leak.update(key, &one);
	stat_count_of(key->tgid, ST_MAY_BE_LEAKED);
}

/* The library's own "may be leaked" flag is set on `o`: set it aside
 * (PF_MAY_LEAK_FLAG). */
static __always_inline int obj_set_aside(struct probe_cfg *cfg, struct obj_key *key)
{
	__u32 word = 0;
	if (!(cfg->flags & PF_MAY_LEAK_FLAG) ||
	    bpf_probe_read_user(&word, sizeof(word), (void *)(key->addr + cfg->kept_offset)) != 0 ||
	    !(word & cfg->kept_mask))
		return 0;
	obj_put_aside(key);
	return 1;
}

/* The put whose delete already fired inside it (PF_DELETE_IN_PUT), or the
 * inner put of a put that counted it (PF_ABSORBS_PUT). */
static __always_inline int obj_absorbed_put(struct obj_key *key)
{
	__u32 *tid = put_due.lookup(key);
	if (!tid || *tid != (__u32)bpf_get_current_pid_tgid())
		return 0;
	put_due.delete(key);
	return 1;
}

/* A get inside the dispose of the object this thread's put just released:
 * the library keeps it (a buffer going back to its pool).  Live again with
 * the reference the get takes, its allocation remembered. */
static __always_inline int obj_revive(struct probe_cfg *cfg, struct obj_key *key)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct obj_key *last = last_released.lookup(&tid);
	if (!(cfg->flags & PF_REVIVE) || !last || last->addr != key->addr ||
	    last->tgid != key->tgid)
		return 0;
	struct grave_val *g = graveyard.lookup(key);
	if (!g)
		return 0;
	struct obj_val val = {.count = 1, .gets = 1, .gen = g->gen, .type_id = g->type_id,
			      .stack_id = g->stack_id,
			      .init_ns = g->init_ns, .caller_ip = g->caller_ip,
			      .name_ptr = g->name_ptr};
	last_released.delete(&tid);
	if (objs.update(key, &val) != 0) {
		stat_count(ST_OBJ_MAP_FULL);
		return 1;
	}
	site_add(key, &val, 1, 0);
	site_count_op(key, &val, OP_GET);  /* the get that revived it */
	graveyard.delete(key);
	stat_count(ST_REVIVED);
	return 1;
}

/* `key` is not in objs: when its process was forked (no exec since) from a
 * process that has the object, the object is the child's too, with the same
 * address and the ancestor's current count: copy it over (the child's gen),
 * so that the child's operations and its report include it. */
static __always_inline struct obj_val *obj_inherit(struct obj_key *key)
{
	struct proc_val *proc = procs.lookup(&key->tgid);
	struct obj_key from = {.tgid = key->tgid, .addr = key->addr};
	if (!proc)
		return 0;
#pragma unroll
	for (int i = 0; i < INHERIT_LEVELS; i++) {
		__u32 *parent = fork_parent.lookup(&from.tgid);
		if (!parent)
			return 0;
		from.tgid = *parent;
		struct obj_val *o = objs.lookup(&from);
		if (o) {
			struct obj_val copy = *o;
			copy.gen = proc->gen;
			copy.since_cp = 0;  /* the parent's, not created since in this process */
			if (objs.insert(key, &copy) == 0)
				site_add(key, &copy, 1, 0);
			if (!(proc->flags & PROC_HAS_OBJECTS))
				proc->flags |= PROC_HAS_OBJECTS;
			return objs.lookup(key);
		}
	}
	return 0;
}

static __always_inline struct obj_val *obj_lookup(struct obj_key *key)
{
	struct obj_val *o = objs.lookup(key);
	return o ? o : obj_inherit(key);
}

#endif
