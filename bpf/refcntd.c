/* refcntd kernel side: count every object's references in a hash map.
 *
 * get and put are aggregated here and never send anything to user space;
 * only process lifecycle events travel through the ring buffer, in order.
 * Compile-time knobs (-D) come from refcntd/kernel.py:bpf_cflags():
 *   FILTERED     1: only processes in `procs` (run / --pid); 0: system-wide
 *   HAS_DELETE   1: the spec has a delete role, a put to zero does not end life
 *   MAX_OBJECTS, MAX_STACKS, MAX_PROCS, MAX_PROBES, MAX_TYPES, MAX_GRAVES
 *   EXIT_CODE_OFFSET  offset of exit_code in task_struct, when known (BTF)
 *   LOADER_PROBE 1: on_loader is attached at ld.so's calls to _dl_debug_state; the
 *                cookie of each is _r_debug minus that call's address
 *   FILTER_COMM  1: only processes whose comm is in comm_allow (system-wide)
 *   CGROUP_ID    when set: only processes in that cgroup v2 (system-wide)
 *   UNWIND       1: CFI unwinding with tables from user space (see unwind.h)
 *   HOLD         1: exported functions are probed at their call sites: a traced
 *                process that maps a module user space has not scanned is stopped
 *                until it has (needs UNWIND's mapping hooks)
 *   SITES        1: count live objects per allocation site and creation time, and
 *                operations per type as they happen (serve: a scrape or a diff reads
 *                O(sites)); MAX_ALLOC_SITES, MAX_AGE_BINS
 *   HISTORY      1: keep get/put history of objects whose type is in
 *                history_types (or all, HISTORY_ALL); MAX_HISTORY, MAX_SITES, MAX_PATHS
 */
#include <uapi/linux/ptrace.h>

#include "refcntd.h"

BPF_ARRAY(probe_cfgs, struct probe_cfg, MAX_PROBES);
BPF_PERCPU_ARRAY(probe_hits, __u64, MAX_PROBES);  /* roles that never fire are reported */
BPF_F_TABLE("hash", struct obj_key, struct obj_val, objs, MAX_OBJECTS, BPF_F_NO_PREALLOC);
BPF_HASH(procs, __u32, struct proc_val, MAX_PROCS);
BPF_HASH(comm_allow, struct comm_key, __u32, 64);
BPF_HASH(pending_init, __u32, struct init_args, MAX_PROCS);
BPF_HASH(types, __u32, struct type_name, MAX_TYPES);
BPF_PERCPU_HASH(totals, __u32, struct type_totals, MAX_TYPES);
BPF_PERCPU_ARRAY(stats, __u64, ST_COUNT);
#ifndef MAX_PROC_STATS
#define MAX_PROC_STATS 16384
#endif
BPF_HASH(proc_stats, struct proc_stat_key, __u64, MAX_PROC_STATS);
BPF_ARRAY(gen_counter, __u64, 1);
BPF_PERCPU_ARRAY(scratch, struct event, 1);
BPF_PERCPU_ARRAY(name_buf, struct type_name, 1);
BPF_TABLE("lru_hash", struct obj_key, struct grave_val, graveyard, MAX_GRAVES);
BPF_TABLE("lru_hash", struct obj_key, __u32, unknown_seen, MAX_GRAVES);
/* Objects whose delete fired inside their last put, before its probe: that
 * put (by this thread id) is already counted. */
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
BPF_PERCPU_ARRAY(anomaly_buf, struct anomaly, 1);
/* fork without exec: a traced child's parent, so that the child's first
 * operation on an object it inherited finds the parent's (inherit_object). */
BPF_TABLE("lru_hash", __u32, __u32, fork_parent, MAX_PROCS);
#if HISTORY
BPF_F_TABLE("hash", struct obj_key, struct hist_val, history, MAX_HISTORY, BPF_F_NO_PREALLOC);
/* A zero hist_val to start a history from: memset of a large struct is not
 * inlined by LLVM (it aborts the whole process at --history-depth >= 32). */
BPF_ARRAY(hist_zero, struct hist_val, 1);
BPF_HASH(released_sites, struct site_key, __u64, MAX_SITES);
BPF_F_TABLE("hash", struct path_key, struct path_val, hist_paths, MAX_PATHS, BPF_F_NO_PREALLOC);
BPF_HASH(history_types, __u32, __u32, 256);
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 1024
#endif
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);  /* 4 MiB: bursts of short-lived processes */

/* Counted twice: in the totals, and for the current process (whose report shows
 * its own counts; whatever a process's probe or event loses happens in it). */
static __always_inline void count_stat(int which)
{
	__u64 *v = stats.lookup(&which);
	if (v)
		*v += 1;
	struct proc_stat_key k = {.tgid = bpf_get_current_pid_tgid() >> 32, .stat = which};
	__u64 one = 1, *own = proc_stats.lookup(&k);
	if (own) {
		__sync_fetch_and_add(own, 1);
		return;
	}
	long err = proc_stats.insert(&k, &one);
	if (err == -17) {  /* EEXIST: another CPU added it first */
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

/* bcc rewrites map calls in the main file only: the loader pastes these in. */
#include "stackstore.h"  /* inlined by the loader */
#include "unwind.h"  /* inlined by the loader */

/* The verifier refuses a ctx load at a computed offset, so a register is
 * read with one probe read of the saved pt_regs at its offset. */
static __always_inline __u64 fetch(struct pt_regs *ctx, struct arg_loc *loc)
{
	__u64 value = 0;
	if (loc->kind == LOC_IMM)
		return loc->value;
	if (loc->reg_off > sizeof(struct pt_regs) - 8)
		return 0;
	bpf_probe_read_kernel(&value, sizeof(value), (void *)ctx + loc->reg_off);
	if (loc->kind == LOC_MEM) {
		void *addr = (void *)(value + loc->value);
		value = 0;
		switch (loc->size) {
		case 1: bpf_probe_read_user(&value, 1, addr); break;
		case 2: bpf_probe_read_user(&value, 2, addr); break;
		case 4: bpf_probe_read_user(&value, 4, addr); break;
		default: bpf_probe_read_user(&value, 8, addr); break;
		}
	}
	switch (loc->size) {  /* truncate, then sign-extend signed values */
	case 1: return loc->is_signed ? (__u64)(__s64)(__s8)value : (__u8)value;
	case 2: return loc->is_signed ? (__u64)(__s64)(__s16)value : (__u16)value;
	case 4: return loc->is_signed ? (__u64)(__s64)(__s32)value : (__u32)value;
	}
	return value;
}

static __always_inline void emit(struct event *ev)
{
	if (events.ringbuf_output(ev, sizeof(*ev), 0) != 0)
		count_stat(ST_EVENT_LOST);
}

static __always_inline struct event *new_event(__u32 kind, __u32 tgid, __u32 pid, __u32 gen)
{
	int zero = 0;
	struct event *ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	ev->kind = kind;
	ev->tgid = tgid;
	ev->pid = pid;
	ev->gen = gen;
	ev->ts = bpf_ktime_get_ns();
	ev->exit_code = -1;
	ev->argc = 0;
	ev->path[0] = 0;
	bpf_get_current_comm(ev->comm, sizeof(ev->comm));
	return ev;
}

/* Whether a process found system-wide passes the target's comm / cgroup filters. */
static __always_inline int allowed(void)
{
#ifdef CGROUP_ID
	if (bpf_get_current_cgroup_id() != CGROUP_ID)
		return 0;
#endif
#if FILTER_COMM
	struct comm_key key = {};
	bpf_get_current_comm(key.comm, sizeof(key.comm));
	if (!comm_allow.lookup(&key))
		return 0;
#endif
	return 1;
}

static __always_inline struct proc_val *register_proc(__u32 tgid, __u32 kind, __u32 pid)
{
	int zero = 0;
	__u64 *counter = gen_counter.lookup(&zero);
	if (!counter)
		return 0;
	struct proc_val p = {};
	p.gen = __sync_fetch_and_add(counter, 1) + 1;
	p.start_ns = bpf_ktime_get_ns();
	if (kind == EV_PROC && !allowed())
		p.flags = PROC_IGNORED;
	if (procs.update(&tgid, &p) != 0) {
		count_stat(ST_PROC_MAP_FULL);
		return 0;
	}
	if (!(p.flags & PROC_IGNORED)) {
		struct event *ev = new_event(kind, tgid, pid, p.gen);
		if (ev)
			emit(ev);
	}
	return procs.lookup(&tgid);
}

/* 0 when the string's page is not present yet (a .rodata literal nobody has
 * touched): user space then reads the name from the file via name_ptr. */
static __always_inline __u32 intern_type(__u64 name_ptr)
{
	int zero = 0;
	struct type_name *buf = name_buf.lookup(&zero);
	if (!buf)
		return 0;
	__builtin_memset(buf->name, 0, TYPE_NAME_LEN);
	if (bpf_probe_read_user_str(buf->name, TYPE_NAME_LEN, (void *)name_ptr) <= 0)
		return 0;
	__u32 hash = FNV_OFFSET;
#pragma unroll
	for (int i = 0; i < TYPE_NAME_LEN; i++) {
		if (buf->name[i] == 0)
			break;
		hash = (hash ^ (__u8)buf->name[i]) * FNV_PRIME;
	}
	hash |= 1;  /* 0 means "not read" */
	if (types.lookup(&hash) == 0 && types.update(&hash, buf) != 0)
		count_stat(ST_TYPE_MAP_FULL);
	return hash;
}

enum { OP_INIT, OP_GET, OP_PUT, OP_RELEASED };  /* count_op() */

#if SITES
/* Allocated as entries appear (a few per site and second, not 65536 each up front). */
BPF_F_TABLE("hash", struct alloc_site, struct alloc_count, alloc_sites, MAX_ALLOC_SITES,
	    BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct since_key, struct since_count, since, MAX_ALLOC_SITES,
	    BPF_F_NO_PREALLOC);
BPF_F_TABLE("hash", struct age_key, __s64, age_bins, MAX_AGE_BINS, BPF_F_NO_PREALLOC);
BPF_ARRAY(checkpoint, __u64, 1);  /* the current checkpoint (ns), 0: none */

/* Objects whose type name was not readable in the kernel keep its pointer. */
static __always_inline struct alloc_site site_of(struct obj_key *key, struct obj_val *o)
{
	struct alloc_site s = {.tgid = key->tgid, .gen = o->gen, .type_id = o->type_id,
			       .name_ptr = o->type_id ? 0 : o->name_ptr,
			       .stack_id = o->stack_id, .caller_ip = o->caller_ip};
	return s;
}

/* Every operation as it happens, so the live objects' share needs no walk: per
 * type, or, for an object whose type name the kernel could not read (type_id 0),
 * at its allocation site, which has the name's pointer for user space. */
static __always_inline void count_op(struct obj_key *key, struct obj_val *o, int op)
{
	if (!o->type_id) {
		struct alloc_site s = site_of(key, o);
		struct alloc_count *c = alloc_sites.lookup(&s);
		if (!c || op == OP_INIT)  /* inits: site_add's `created` */
			return;
		__sync_fetch_and_add(op == OP_GET ? &c->gets : op == OP_PUT ? &c->puts
				     : &c->released, 1);
		return;
	}
	struct type_totals zero_totals = {};
	struct type_totals *t = totals.lookup_or_try_init(&o->type_id, &zero_totals);
	if (!t)
		return;
	switch (op) {  /* per CPU: no atomics needed */
	case OP_INIT: t->inits += 1; break;
	case OP_GET: t->gets += 1; break;
	case OP_PUT: t->puts += 1; break;
	default: t->released += 1; break;
	}
}

/* A counter is created by an increment only: a decrement never recreates an
 * entry user space removed (a pruned age bin stays pruned). */
static __always_inline void count_age(struct alloc_site *s, __u64 init_ns, __s64 delta)
{
	struct age_key k = {.tgid = s->tgid, .gen = s->gen, .type_id = s->type_id,
			    .bin = (__u32)(init_ns >> AGE_FINE_SHIFT), .name_ptr = s->name_ptr};
	__s64 zero = 0, *n;
	/* an old object (revived, inherited) never recreates a fine bin user space has
	 * dropped: only its coarse bin counts it */
	int first = bpf_ktime_get_ns() - init_ns > AGE_FINE_HORIZON_S * 1000000000ULL;
#pragma unroll
	for (int level = 0; level < 2; level++) {
		if (level < first)
			continue;
		if (level)
			k.bin = AGE_COARSE | (__u32)(init_ns >> AGE_COARSE_SHIFT);
		if (delta > 0)
			n = age_bins.lookup_or_try_init(&k, &zero);
		else
			n = age_bins.lookup(&k);
		if (n)
			__sync_fetch_and_add(n, delta);
		else if (delta > 0)
			count_stat(ST_AGE_BINS_FULL);
	}
}

/* Before `o` is stored: is it created since the current checkpoint? */
static __always_inline void site_classify(struct obj_val *o)
{
	int zero = 0;
	__u64 *cp = checkpoint.lookup(&zero);
	o->since_cp = cp && *cp && o->init_ns >= *cp ? *cp : 0;
}

/* `o` (stored as `key`) became live (+1) or stopped being live (-1); `born`: by its
 * init (not revived or inherited). */
static __always_inline void site_add(struct obj_key *key, struct obj_val *o, __s64 delta,
				     int born)
{
	struct alloc_site s = site_of(key, o);
	struct alloc_count zero = {}, *c;
	if (delta > 0)
		c = alloc_sites.lookup_or_try_init(&s, &zero);
	else
		c = alloc_sites.lookup(&s);
	if (c) {
		__sync_fetch_and_add(&c->live, delta);
		if (born)
			__sync_fetch_and_add(&c->created, 1);
	}
	count_age(&s, o->init_ns, delta);
	if (!c && delta > 0) {  /* one count per object, whichever table was full */
		count_stat(ST_ALLOC_SITES_FULL);
		return;
	}
	if (!o->since_cp)
		return;
	struct since_key k = {.site = s, .cp = o->since_cp};
	struct since_count none = {}, *n;
	if (delta > 0)
		n = since.lookup_or_try_init(&k, &none);
	else
		n = since.lookup(&k);
	if (n) {
		__sync_fetch_and_add(&n->live, delta);
		__sync_fetch_and_add(&n->age_sum, delta * (__s64)((o->init_ns - o->since_cp) >> 10));
	} else if (delta > 0) {
		count_stat(ST_ALLOC_SITES_FULL);
	}
}
#else
static __always_inline void count_op(struct obj_key *key, struct obj_val *o, int op) {}
static __always_inline void site_classify(struct obj_val *o) {}
static __always_inline void site_add(struct obj_key *key, struct obj_val *o, __s64 delta,
				     int born) {}
#endif

/* Without SITES the totals are added when an object is released (cheaper per
 * operation; serve and attach, which read live objects' operations, have SITES). */
static __always_inline void add_totals(struct obj_key *key, struct obj_val *o)
{
	struct type_totals zero_totals = {};
	if (SITES) {
		count_op(key, o, OP_RELEASED);
		return;
	}
	struct type_totals *t = totals.lookup_or_try_init(&o->type_id, &zero_totals);
	if (!t)
		return;
	t->inits += 1;
	t->gets += o->gets;
	t->puts += o->puts;
	t->released += 1;
}

static __always_inline void capture_stacks(struct pt_regs *ctx, struct probe_cfg *cfg,
					   __u64 *stack_id, __u64 *caller_ip)
{
	*stack_id = record_stack(ctx);
	*caller_ip = 0;
	if (cfg->caller_sp >= 0) {
		void *slot = (void *)(PT_REGS_SP(ctx) + (__u32)cfg->caller_sp);
		if (bpf_probe_read_user(caller_ip, sizeof(*caller_ip), slot) != 0)
			count_stat(ST_CALLER_UNREAD);
	}
}

#if HISTORY
static __always_inline void start_history(struct obj_key *key, __u32 type_id, __u64 serial)
{
	__u32 zero = 0;
	if (!HISTORY_ALL && type_id && !history_types.lookup(&type_id))
		return;  /* an unread type name (0) keeps history: filtered when shown */
	struct hist_val *blank = hist_zero.lookup(&zero);  /* never written: all zero */
	if (!blank)
		return;
	if (history.update(key, blank) != 0) {
		count_stat(ST_HISTORY_MAP_FULL);
		return;
	}
	struct hist_val *h = history.lookup(key);
	if (h)
		h->serial = serial;
}

/* Exact count of this object's operations at this path, in hist_paths. */
static __always_inline void count_path(struct hist_val *h, struct obj_key *key, __u32 op,
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
			count_stat(ST_PATHS_MAP_FULL);
			__sync_fetch_and_add(&h->paths_lost, 1);
			return;
		}
	}
	__sync_fetch_and_add(&v->count, 1);
	v->last_ns = e->ts;
}

/* Every operation at this path of this process's objects of this type. */
static __always_inline void count_type_path(struct obj_key *key, __u32 type_id, __u32 op,
					    struct hist_entry *e)
{
	struct site_key k = {.tgid = key->tgid, .type_id = type_id, .op = op,
			     .stack_id = e->stack_id, .caller_ip = e->caller_ip};
	__u64 zero = 0;
	__u64 *total = released_sites.lookup_or_try_init(&k, &zero);
	if (total)
		__sync_fetch_and_add(total, 1);
	else
		count_stat(ST_SITES_MAP_FULL);
}

static __always_inline void record(struct pt_regs *ctx, struct probe_cfg *cfg,
				   struct obj_key *key, __u32 type_id, __u32 op, __s64 count_after)
{
	struct hist_val *h = history.lookup(key);
	if (!h)
		return;
	struct hist_entry e = {.op = op, .count_after = count_after, .ts = bpf_ktime_get_ns()};
	capture_stacks(ctx, cfg, &e.stack_id, &e.caller_ip);
	count_path(h, key, op, &e);
	count_type_path(key, type_id, op, &e);
	__u64 i = __sync_fetch_and_add(&h->n, 1);
	if (i < HISTORY_DEPTH)
		h->e[i & (HISTORY_DEPTH - 1)] = e;
}

/* A released object's paths are dropped: released_sites already counted them. */
static __always_inline void fold_history(struct obj_key *key, __u32 type_id)
{
	struct hist_val *h = history.lookup(key);
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
		count_stat(ST_PATHS_STALE);
	history.delete(key);
}
#else
static __always_inline void start_history(struct obj_key *key, __u32 type_id, __u64 serial) {}
static __always_inline void record(struct pt_regs *ctx, struct probe_cfg *cfg,
				   struct obj_key *key, __u32 type_id, __u32 op,
				   __s64 count_after) {}
static __always_inline void fold_history(struct obj_key *key, __u32 type_id) {}
#endif

/* What is remembered of an object: kept in the graveyard once it is released
 * (released_ns set), and what an anomaly says about it. */
static __always_inline struct grave_val describe(struct obj_val *o, __u64 released_ns)
{
	struct grave_val g = {.type_id = o->type_id, .gen = o->gen, .stack_id = o->stack_id,
			      .caller_ip = o->caller_ip,
			      .name_ptr = o->name_ptr, .init_ns = o->init_ns,
			      .released_ns = released_ns};
	return g;
}

static __always_inline void release(struct obj_key *key, struct obj_val *o)
{
	struct grave_val g = describe(o, bpf_ktime_get_ns());
	graveyard.update(key, &g);
	add_totals(key, o);
	site_add(key, o, -1, 0);
	fold_history(key, o->type_id);
	objs.delete(key);
}

/* Report misuse of `key` with the offending stack; `g` describes the object
 * (describe() of a live one, its graveyard entry), NULL if never seen. */
static __always_inline void report_anomaly(struct pt_regs *ctx, struct probe_cfg *cfg,
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
	capture_stacks(ctx, cfg, &a->stack_id, &a->caller_ip);
	if (g) {
		a->type_id = g->type_id;
		a->gen = g->gen;
		a->alloc_stack_id = g->stack_id;
		a->alloc_caller_ip = g->caller_ip;
		a->name_ptr = g->name_ptr;
		a->init_ns = g->init_ns;
		a->released_ns = g->released_ns;
	}
	if (events.ringbuf_output(a, sizeof(*a), 0) != 0)
		count_stat(ST_EVENT_LOST);
}

/* An operation on an object not in `objs` while this thread is inside a
 * constructor: most likely the object being built; kept for its init. */
static __always_inline int early_op(struct obj_key *key, __s64 delta)
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

/* An operation on an object not in `objs`: after its delete, or never seen
 * (each never-seen object is reported once; all are counted). */
static __always_inline void missing_object(struct pt_regs *ctx, struct probe_cfg *cfg,
					   struct obj_key *key, __u32 after_delete,
					   __u32 unknown, int unknown_stat)
{
	struct grave_val *g = graveyard.lookup(key);
	if (g) {
		report_anomaly(ctx, cfg, after_delete, key, 0, g);
		return;
	}
	if (may_leak.lookup(key))
		return;
	struct proc_val *proc = procs.lookup(&key->tgid);
	if ((FILTERED && !proc) || (proc && (proc->flags & PROC_IGNORED)))
		return;
	count_stat(unknown_stat);
	__u32 one = 1;
	if ((cfg->flags & PF_QUIET_UNKNOWN) || unknown_seen.lookup(key))
		return;
	unknown_seen.update(key, &one);
	report_anomaly(ctx, cfg, unknown, key, 0, 0);
}

/* A library's static objects (a count of -1 that its ref/unref leave alone):
 * operations on them are not counted (PF_STATIC_IF). */
static __always_inline int is_static(struct probe_cfg *cfg, __u64 addr)
{
	__s32 value = 0;
	if (!(cfg->flags & PF_STATIC_IF) ||
	    bpf_probe_read_user(&value, sizeof(value), (void *)(addr + cfg->static_offset)) != 0 ||
	    value != cfg->static_value)
		return 0;
	count_stat(ST_STATIC_SKIPPED);
	return 1;
}

/* The library's own "may be leaked" flag is set on `o`: stop counting it,
 * and let later operations on it pass (PF_MAY_LEAK_FLAG). */
static __always_inline int set_aside(struct probe_cfg *cfg, struct obj_key *key)
{
	__u32 word = 0, one = 1;
	if (!(cfg->flags & PF_MAY_LEAK_FLAG) ||
	    bpf_probe_read_user(&word, sizeof(word), (void *)(key->addr + cfg->kept_offset)) != 0 ||
	    !(word & cfg->kept_mask))
		return 0;
	if (SITES) {
		struct obj_val *o = objs.lookup(key);
		if (o)
			site_add(key, o, -1, 0);
	}
	objs.delete(key);
	may_leak.update(key, &one);
	count_stat(ST_MAY_BE_LEAKED);
	return 1;
}

/* The put whose delete already fired inside it (PF_DELETE_IN_PUT). */
static __always_inline int absorbed_put(struct obj_key *key)
{
	__u32 *tid = put_due.lookup(key);
	if (!tid || *tid != (__u32)bpf_get_current_pid_tgid())
		return 0;
	put_due.delete(key);
	return 1;
}

/* The type-name pointer: an argument, or loaded from a class structure it
 * points to (type_deref: offset + 1 per pointer load). */
static __always_inline __u64 type_pointer(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	if (!cfg->type.kind)
		return 0;
	__u64 ptr = fetch(ctx, &cfg->type);
#pragma unroll
	for (int i = 0; i < 2; i++) {
		if (!cfg->type_deref[i] || !ptr)
			break;
		void *slot = (void *)(ptr + cfg->type_deref[i] - 1);
		ptr = 0;
		bpf_probe_read_user(&ptr, sizeof(ptr), slot);
	}
	return ptr;
}

/* The object of an init: an argument, the return value, or what the
 * constructor stored through the out-pointer saved at its entry. */
static __always_inline __u64 init_object(struct pt_regs *ctx, struct probe_cfg *cfg,
					 struct init_args *args)
{
	__u64 obj = 0;
	if (!(cfg->flags & PF_OBJ_OUT))
		return fetch(ctx, &cfg->obj);
	if (args->out_ptr)
		bpf_probe_read_user(&obj, sizeof(obj), (void *)args->out_ptr);
	return obj;
}

/* Arguments of an init: read now, or saved by the constructor's entry probe
 * when this is its return probe (the registers are gone by then). */
static __always_inline int init_args(struct pt_regs *ctx, struct probe_cfg *cfg,
				     struct init_args *out)
{
	out->type_ptr = type_pointer(ctx, cfg);
	out->count = cfg->count.kind ? (__s64)fetch(ctx, &cfg->count) : cfg->fixed_count;
	out->out_ptr = 0;
	if (!cfg->is_return || (!cfg->type.kind && !cfg->count.kind && !(cfg->flags & PF_OBJ_OUT)))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	struct init_args *saved = pending_init.lookup(&tid);
	if (!saved) {
		count_stat(ST_INIT_ARGS_LOST);
		return -1;
	}
	out->type_ptr = cfg->type.kind ? saved->type_ptr : 0;
	out->count = cfg->count.kind ? saved->count : cfg->fixed_count;
	out->out_ptr = saved->out_ptr;
	pending_init.delete(&tid);
	return 0;
}

static __always_inline int do_init_entry(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (FILTERED && !procs.lookup(&tgid))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), one = 1;
	__u32 *depth = ctor_depth.lookup(&tid);
	if (depth)
		__sync_fetch_and_add(depth, 1);
	else
		ctor_depth.update(&tid, &one);
	struct init_args args = {};
	args.type_ptr = type_pointer(ctx, cfg);
	args.count = cfg->count.kind ? (__s64)fetch(ctx, &cfg->count) : 0;
	if (cfg->flags & PF_OBJ_OUT)
		args.out_ptr = fetch(ctx, &cfg->obj);
	pending_init.update(&tid, &args);
	return 0;
}

/* A constructor returned: this thread is one level less inside constructors. */
static __always_inline void ctor_returned(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	__u32 *depth = ctor_depth.lookup(&tid);
	if (depth && *depth > 1)
		__sync_fetch_and_add(depth, -1);
	else if (depth)
		ctor_depth.delete(&tid);
}

static __always_inline int do_init(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (cfg->is_return)
		ctor_returned();
	struct proc_val *proc = procs.lookup(&tgid);
	if (!proc) {
		if (FILTERED)
			return 0;
		proc = register_proc(tgid, EV_PROC, tgid);
		if (!proc)
			return 0;
	}
	if (proc->flags & PROC_IGNORED)
		return 0;
	struct init_args args = {};
	if (init_args(ctx, cfg, &args) != 0)
		return 0;
	struct obj_key key = {.tgid = tgid, .addr = init_object(ctx, cfg, &args)};
	if (key.addr == 0 || is_static(cfg, key.addr))
		return 0;
	put_due.delete(&key);
	may_leak.delete(&key);
	struct obj_val val = {};
	val.count = args.count;
	__s64 *early = early_ops.lookup(&key);
	if (early) {
		val.count += *early;
		early_ops.delete(&key);
	}
	val.type_id = cfg->fixed_type;
	if (cfg->type.kind) {
		val.type_id = intern_type(args.type_ptr);
		if (!val.type_id)
			val.name_ptr = args.type_ptr;
	}
	val.gen = proc->gen;
	val.init_ns = bpf_ktime_get_ns();
	capture_stacks(ctx, cfg, &val.stack_id, &val.caller_ip);
	graveyard.delete(&key);
	unknown_seen.delete(&key);
	struct obj_val *old = objs.lookup(&key);
	if (old) {
		count_stat(old->gen == val.gen ? ST_REINIT_LIVE : ST_STALE_REPLACED);
		site_add(&key, old, -1, 0);
	}
	site_classify(&val);
	if (objs.update(&key, &val) != 0) {
		count_stat(ST_OBJ_MAP_FULL);
		return 0;
	}
	site_add(&key, &val, 1, 1);
	count_op(&key, &val, OP_INIT);
	if (HISTORY) {
		start_history(&key, val.type_id, val.init_ns);
		record(ctx, cfg, &key, val.type_id, ROLE_INIT, val.count);
	}
	return 0;
}

/* A get inside the dispose of the object this thread's put just released:
 * the library keeps it (a buffer going back to its pool).  Live again with
 * the reference the get takes, its allocation remembered. */
static __always_inline int revive(struct probe_cfg *cfg, struct obj_key *key)
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
		count_stat(ST_OBJ_MAP_FULL);
		return 1;
	}
	site_add(key, &val, 1, 0);
	count_op(key, &val, OP_GET);  /* the get that revived it */
	graveyard.delete(key);
	count_stat(ST_REVIVED);
	return 1;
}

#define INHERIT_LEVELS 4  /* parent, grandparent, ... */

/* `key` is not in objs: when its process was forked (no exec since) from a
 * process that has the object, the object is the child's too, with the same
 * address and the ancestor's current count: copy it over (the child's gen),
 * so that the child's operations and its report include it. */
static __always_inline struct obj_val *inherit_object(struct obj_key *key)
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
			return objs.lookup(key);
		}
	}
	return 0;
}

static __always_inline struct obj_val *lookup_or_inherit(struct obj_key *key)
{
	struct obj_val *o = objs.lookup(key);
	return o ? o : inherit_object(key);
}

static __always_inline int do_get(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = fetch(ctx, &cfg->obj)};
	if (key.addr == 0 || is_static(cfg, key.addr))  /* foo_free(NULL): a no-op */
		return 0;
	struct obj_val *o = lookup_or_inherit(&key);
	if (!o) {
		if (!early_op(&key, 1) && !revive(cfg, &key))
			missing_object(ctx, cfg, &key, AN_GET_AFTER_DELETE, AN_UNKNOWN_GET,
				       ST_UNKNOWN_GET);
		return 0;
	}
	if (set_aside(cfg, &key))
		return 0;
	__s64 before = __sync_fetch_and_add(&o->count, 1);
	__sync_fetch_and_add(&o->gets, 1);
	count_op(&key, o, OP_GET);
	if (HISTORY)
		record(ctx, cfg, &key, o->type_id, ROLE_GET, before + 1);
	return 0;
}

static __always_inline int do_put(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = fetch(ctx, &cfg->obj)};
	if (key.addr == 0 || is_static(cfg, key.addr))
		return 0;
	struct obj_val *o = lookup_or_inherit(&key);
	if (!o) {
		if (absorbed_put(&key))
			return 0;
		if (!early_op(&key, -1))
			missing_object(ctx, cfg, &key, AN_PUT_AFTER_DELETE, AN_UNKNOWN_PUT,
				       ST_UNKNOWN_PUT);
		return 0;
	}
	if (set_aside(cfg, &key))
		return 0;
	__sync_fetch_and_add(&o->puts, 1);
	__s64 before = __sync_fetch_and_add(&o->count, -1);
	count_op(&key, o, OP_PUT);
	if (HISTORY)
		record(ctx, cfg, &key, o->type_id, ROLE_PUT, before - 1);
	if (before <= 0) {
		count_stat(ST_PUT_BELOW_ZERO);
		struct grave_val g = describe(o, 0);
		report_anomaly(ctx, cfg, before == 0 ? AN_DOUBLE_PUT : AN_NEGATIVE_COUNT, &key,
			       before, &g);
	}
	if (before == 1 && (!HAS_DELETE || (cfg->flags & PF_FREES_AT_ZERO))) {
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		release(&key, o);
		last_released.update(&tid, &key);
	}
	return 0;
}

static __always_inline int do_delete(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = fetch(ctx, &cfg->obj)};
	if (key.addr == 0)
		return 0;
	struct obj_val *o = lookup_or_inherit(&key);
	if (!o) {
		missing_object(ctx, cfg, &key, AN_DOUBLE_DELETE, AN_UNKNOWN_DELETE,
			       ST_UNKNOWN_DELETE);
		return 0;
	}
	if ((cfg->flags & PF_DELETE_IN_PUT) && o->count == 1) {
		/* The last put is under way and its own probe fires after this:
		 * count it now, and let that probe pass. */
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		__sync_fetch_and_add(&o->puts, 1);
		__sync_fetch_and_add(&o->count, -1);
		put_due.update(&key, &tid);
		count_op(&key, o, OP_PUT);
	}
	if (o->count != 0) {
		struct grave_val g = describe(o, 0);
		report_anomaly(ctx, cfg, AN_DELETE_LIVE, &key, o->count, &g);
	}
	if (HISTORY)
		record(ctx, cfg, &key, o->type_id, ROLE_DELETE, o->count);
	release(&key, o);
	return 0;
}

/* A call-site probe on `jcc func` counts only when the jump is taken: the
 * kernel emulates the jcc after us, on the same flags. */
static __always_inline int branch_taken(struct pt_regs *ctx, __u32 cond)
{
	__u64 f = ctx->flags;
	int cf = f & 1, pf = (f >> 2) & 1, zf = (f >> 6) & 1, sf = (f >> 7) & 1;
	int of = (f >> 11) & 1, r;
	switch ((cond & 0xf) >> 1) {
	case 0: r = of; break;
	case 1: r = cf; break;
	case 2: r = zf; break;
	case 3: r = cf | zf; break;
	case 4: r = sf; break;
	case 5: r = pf; break;
	case 6: r = sf != of; break;
	default: r = zf | (sf != of); break;
	}
	return (cond & 1) ? !r : r;
}

/* ref_sink: a floating object's reference becomes its owner's (no change);
 * on an object that is not floating it is a get. */
static __always_inline int do_sink(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u64 addr = fetch(ctx, &cfg->obj), word = 0;
	if (addr && bpf_probe_read_user(&word, sizeof(word), (void *)(addr + cfg->flag_offset)) == 0
	    && (word & cfg->flag_mask)) {
		struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .addr = addr};
		if (objs.lookup(&key))
			count_stat(ST_FLOATING_SUNK);
		return 0;
	}
	return do_get(ctx, cfg);
}

/* A function that changes no count (it calls a probed get/put itself) but
 * is where the library's "may be leaked" flag can be read. */
static __always_inline int do_check(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = fetch(ctx, &cfg->obj)};
	if (key.addr && objs.lookup(&key))
		set_aside(cfg, &key);
	return 0;
}

/* The probe's logic; the bpf cookie is the probe's index in probe_cfgs,
 * which says the role and where its arguments are. */
static __always_inline int probe_body(struct pt_regs *ctx)
{
	__u32 index = bpf_get_attach_cookie(ctx);
	struct probe_cfg *cfg = probe_cfgs.lookup(&index);
	if (!cfg)
		return 0;
	if (cfg->cond && !branch_taken(ctx, cfg->cond))
		return 0;
	__u64 *hits = probe_hits.lookup(&index);
	if (hits)
		*hits += 1;
	switch (cfg->role) {
	case ROLE_INIT: return do_init(ctx, cfg);
	case ROLE_GET: return do_get(ctx, cfg);
	case ROLE_PUT: return do_put(ctx, cfg);
	case ROLE_DELETE: return do_delete(ctx, cfg);
	case ROLE_INIT_ENTRY: return do_init_entry(ctx, cfg);
	case ROLE_SINK: return do_sink(ctx, cfg);
	case ROLE_CHECK: return do_check(ctx, cfg);
	}
	return 0;
}

/* Whether this operation records a stack: every init, every operation with
 * history, and a get/put/delete about to be reported as an anomaly (a
 * cheap look at the object first, so counting stays cheap). */
static __always_inline int needs_stack(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	if (cfg->role == ROLE_INIT || HISTORY)
		return 1;
	if (cfg->role == ROLE_INIT_ENTRY || cfg->role == ROLE_OFF)
		return 0;
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = fetch(ctx, &cfg->obj)};
	struct obj_val *o = objs.lookup(&key);
	if (!o)  /* unknown or released: reported unless seen before or not traced */
		return !unknown_seen.lookup(&key) && (!FILTERED || procs.lookup(&key.tgid));
	if (cfg->role == ROLE_PUT)
		return o->count <= 0;
	return cfg->role == ROLE_DELETE && o->count != 0;
}

/* One program for every entry and return probe: the stack first where the
 * operation records one (unwind.h), then the logic. */
int on_probe(struct pt_regs *ctx)
{
	__u32 index = bpf_get_attach_cookie(ctx);
	struct probe_cfg *cfg = probe_cfgs.lookup(&index);
	set_probe_stack(0);
	if (cfg && needs_stack(ctx, cfg))
		probe_progs.call(ctx, PROG_UNWIND);
	/* on_body, not probe_body inlined here: the verifier then checks the body once
	 * (on_probe 0.15 s -> a few ms at every start), for a tail call per probe */
	return to_body(ctx, 0);
}

int on_body(struct pt_regs *ctx)
{
	return probe_body(ctx);
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;
	maps_fork(parent, args->child_pid);
	if (!procs.lookup(&parent))
		return 0;
	/* Threads pass here too: their entry is dropped again in sched_process_exit. */
	register_proc(args->child_pid, EV_FORK, parent);
	__u32 child = args->child_pid;
	fork_parent.update(&child, &parent);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_execve)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	fork_parent.delete(&tgid);  /* a new image: nothing inherited any more */
	if (FILTERED && !procs.lookup(&tgid))
		return 0;
	struct event *ev = new_event(EV_EXECVE, tgid, (__u32)id, 0);
	if (!ev)
		return 0;
	bpf_probe_read_user_str(ev->path, sizeof(ev->path), args->filename);
	const char *const *argv = (const char *const *)args->argv;
#pragma unroll
	for (int i = 0; i < ARGV_SLOTS; i++) {
		const char *arg = 0;
		if (bpf_probe_read_user(&arg, sizeof(arg), &argv[i]) != 0 || !arg)
			break;
		bpf_probe_read_user_str(ev->argv[i], ARGV_LEN, arg);
		ev->argc = i + 1;
	}
	emit(ev);
	return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	ctor_depth.delete(&tid);  /* a constructor that never returned must not outlive its thread */
	fork_parent.delete(&tid);
	if (tid != tgid && procs.lookup(&tid)) {
		struct event *gone = new_event(EV_THREAD_GONE, tgid, tid, 0);
		procs.delete(&tid);
		if (gone)
			emit(gone);
	}
	if (tid != tgid)
		maps_exit(tid);  /* a thread's copy made at its clone */
	if (!args->group_dead)
		return 0;
	maps_exit(tgid);
	struct proc_val *proc = procs.lookup(&tgid);
	if (!proc)
		return 0;
	struct event *ev = new_event(EV_EXIT, tgid, tid, proc->gen);
	procs.delete(&tgid);
	if (!ev)
		return 0;
#ifdef EXIT_CODE_OFFSET
	void *task = (void *)bpf_get_current_task();  /* read at a BTF offset, no headers */
	int code = 0;
	if (bpf_probe_read_kernel(&code, sizeof(code), (void *)task + EXIT_CODE_OFFSET) == 0)
		ev->exit_code = code;
#endif
	emit(ev);
	return 0;
}

#if HOLD
#ifndef MAX_VETTED
#define MAX_VETTED 65536
#endif
BPF_HASH(vetted, struct file_key, __u32, MAX_VETTED);  /* modules user space has scanned */
BPF_HASH(hold_owners, struct file_key, __u32, 64);      /* modules defining such functions */
BPF_HASH(held, __u32, struct hold_key, MAX_PROCS);      /* stopped, waiting for a scan */
BPF_HASH(hold_funcs, struct hold_key, __u32, 256);      /* the functions themselves */

static __always_inline void hold(__u32 tgid, struct hold_key *why)
{
	held.update(&tgid, why);
	struct event *ev = new_event(EV_HOLD, tgid, (__u32)bpf_get_current_pid_tgid(), 0);
	if (ev)
		emit(ev);
	bpf_send_signal(19);  /* SIGSTOP: the whole process, before it returns to user space */
}

/* An exported function probed at its call sites is only counted exactly if
 * every module that calls it has its call sites probed before its code runs.
 * A process that maps (or execs) a module nobody has scanned, while it maps a
 * module defining such a function, is stopped here, before the mmap or exec
 * returns; user space scans the module, probes its calls (or moves the
 * function back to its entry probe) and continues it.  The module that was
 * mapped first is also caught: the check covers every mapping of the process. */
static __always_inline void hold_if_unvetted(__u32 tgid, struct file_key *file)
{
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
	hold(tgid, &why);
}

/* dlsym()/dlvsym() returning such a function's address: it will be called
 * through a pointer, past every call-site probe.  The process stops before
 * the caller sees the address, and user space moves the function back to its
 * entry probe. */
int on_dlsym_return(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u64 addr = PT_REGS_RC(ctx);
	struct exec_maps *maps = addr && tracked(tgid) ? exec_maps.lookup(&tgid) : 0;
	if (!maps)
		return 0;
	struct exec_map m = {};
	if (!find_map(maps, addr, &m))
		return 0;
	struct hold_key key = {.file = m.file,
			       .offset = file_offset_in(&m, cfi_modules.lookup(&m.file), addr)};
	if (hold_funcs.lookup(&key))
		hold(tgid, &key);
	return 0;
}
#endif

#if LOADER_PROBE
/* ld.so calls _dl_debug_state() after every change to its list of loaded
 * objects.  Reporting each object's path here, in order with the exit event,
 * lets user space symbolize frames of libraries dlclose'd before exit. */
struct link_map_head {
	__u64 l_addr;
	__u64 l_name;
	__u64 l_ld;
	__u64 l_next;
};

int on_loader(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!procs.lookup(&tgid))  /* libraries loaded before tracing starts are on disk */
		return 0;
	__u64 rdebug = PT_REGS_IP(ctx) + (__s64)bpf_get_attach_cookie(ctx);
	int state = 0;
	__u64 map = 0;
	bpf_probe_read_user(&state, sizeof(state), (void *)(rdebug + 24));
	if (state != 0)  /* RT_CONSISTENT only */
		return 0;
	bpf_probe_read_user(&map, sizeof(map), (void *)(rdebug + 8));
	for (int i = 0; i < LINK_MAP_MAX && map; i++) {
		struct link_map_head lm = {};
		if (bpf_probe_read_user(&lm, sizeof(lm), (void *)map) != 0)
			break;
		struct event *ev = new_event(EV_LIBRARY, tgid, (__u32)id, 0);
		if (!ev)
			break;
		if (lm.l_name && bpf_probe_read_user_str(ev->path, sizeof(ev->path),
							 (void *)lm.l_name) > 1)
			emit(ev);
		map = lm.l_next;
	}
	return 0;
}
#endif
