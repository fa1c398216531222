/* Live objects counted where they were created (serve, attach: knob `sites`),
 * per process, allocation site and creation time, so that a scrape or a diff
 * reads O(allocation sites), never every object; and every operation counted
 * per type as it happens (without this knob, an object's operations are added
 * to its type's totals when it is released: cheaper per operation).
 *
 * Sizes (-D): MAX_ALLOC_SITES, MAX_AGE_BINS.
 */
#ifndef REFCNTD_SITES_H
#define REFCNTD_SITES_H

enum { OP_INIT, OP_GET, OP_PUT, OP_RELEASED };  /* site_count_op() */

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
static __always_inline void site_count_op(struct obj_key *key, struct obj_val *o, int op)
{
	if (!KNOB(sites))
		return;
	if (!o->type_id) {
		struct alloc_site s = site_of(key, o);
		struct alloc_count *c = alloc_sites.lookup(&s);
		if (!c || op == OP_INIT)  /* inits: site_add's `created` */
			return;
		__sync_fetch_and_add(op == OP_GET ? &c->gets : op == OP_PUT ? &c->puts
				     : &c->released, 1);
		return;
	}
	struct type_totals *t = type_totals_of(o->type_id);
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
static __always_inline void site_count_age(struct alloc_site *s, __u64 init_ns, __s64 delta)
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
			stat_count(ST_AGE_BINS_FULL);
	}
}

/* Before `o` is stored: is it created since the current checkpoint? */
static __always_inline void site_classify(struct obj_val *o)
{
	int zero = 0;
	if (!KNOB(sites))
		return;
	__u64 *cp = checkpoint.lookup(&zero);
	o->since_cp = cp && *cp && o->init_ns >= *cp ? *cp : 0;
}

/* `o` (stored as `key`) became live (+1) or stopped being live (-1); `born`: by its
 * init (not revived or inherited). */
static __always_inline void site_add(struct obj_key *key, struct obj_val *o, __s64 delta,
				     int born)
{
	if (!KNOB(sites))
		return;
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
	site_count_age(&s, o->init_ns, delta);
	if (!c && delta > 0) {  /* one count per object, whichever table was full */
		stat_count(ST_ALLOC_SITES_FULL);
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
		stat_count(ST_ALLOC_SITES_FULL);
	}
}

#endif
