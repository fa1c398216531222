/* The content-addressed stack store: every user stack refcntd records.
 *
 * BPF_MAP_TYPE_STACK_TRACE keys a stack by a hash bucket and refuses a stack
 * whose bucket holds another one (7 585 of ~18 000 stacks lost at 1 000 short
 * processes).  Here the key is a 64-bit hash of (tgid, gen, frames): the same
 * stack of the same process always lands on the same entry, and a different
 * stack only does when 64-bit hashes collide, which the insert detects by
 * comparing the frames (counted as ST_STACK_COLLISION).  A full store is
 * counted (ST_STACK_LOST).  Each entry belongs to one process generation
 * (proc_stacks), so user space frees exactly that process's stacks once its
 * report is written.
 *
 * Included by refcntd.c after count_stat() and the procs map.
 * The walk itself (frame pointers and CFI) is in unwind.h.
 */
#ifndef REFCNTD_STACKSTORE_H
#define REFCNTD_STACKSTORE_H

#define STACK_HASH_OFFSET 0xcbf29ce484222325ULL  /* FNV-1a 64-bit, over 64-bit words */
#define STACK_HASH_PRIME 0x100000001b3ULL

BPF_F_TABLE("hash", __u64, struct stack_rec, stack_store, MAX_STACKS, BPF_F_NO_PREALLOC);
BPF_HASH(proc_stacks, struct proc_stack, __u32, MAX_STACKS);  /* owner -> process gen */
BPF_PERCPU_ARRAY(stack_scratch, struct stack_rec, 1);

/* Hide a loop counter from LLVM so it keeps the constant bound test the
 * verifier needs (it may otherwise merge it with the data-dependent one). */
#define bounded(i) asm volatile("" : "+r"(i))

static __always_inline __u64 mix(__u64 hash, __u64 word)
{
	return (hash ^ word) * STACK_HASH_PRIME;
}

static __always_inline __u64 stack_hash(struct stack_rec *rec)
{
	__u64 hash = mix(STACK_HASH_OFFSET, ((__u64)rec->gen << 32) | rec->tgid);
	hash = mix(hash, rec->nr);
	for (__u32 i = 0; i < STACK_DEPTH; i++) {
		bounded(i);
		if (i >= rec->nr)
			break;
		hash = mix(hash, rec->ip[i]);
		hash = mix(hash, rec->frame[i].offset);
	}
	return hash | 1;  /* 0 means "no stack" */
}

static __always_inline int same_stack(struct stack_rec *a, struct stack_rec *b)
{
	if (a->tgid != b->tgid || a->gen != b->gen || a->nr != b->nr)
		return 0;
	for (__u32 i = 0; i < STACK_DEPTH; i++) {
		bounded(i);
		if (i >= a->nr)
			break;
		if (a->ip[i] != b->ip[i] || a->frame[i].offset != b->frame[i].offset)
			return 0;
	}
	return 1;
}

/* Key of `rec` in the store, inserting it if new; 0 when it could not be kept. */
static __always_inline __u64 store_stack(struct stack_rec *rec)
{
	__u64 key = stack_hash(rec);
	struct stack_rec *old = stack_store.lookup(&key);
	if (old) {
		if (same_stack(old, rec))
			return key;
		count_stat(ST_STACK_COLLISION);
		return 0;
	}
	struct proc_stack owner = {.tgid = rec->tgid, .stack_id = key};
	__u32 gen = rec->gen;
	if (proc_stacks.update(&owner, &gen) != 0) {
		count_stat(ST_STACK_LOST);
		return 0;
	}
	int err = stack_store.insert(&key, rec);
	if (err == 0)
		return key;
	if (err == -EEXIST) {  /* another thread of the process stored it just now */
		old = stack_store.lookup(&key);
		if (old && same_stack(old, rec))
			return key;
		count_stat(ST_STACK_COLLISION);
		return 0;
	}
	proc_stacks.delete(&owner);
	count_stat(ST_STACK_LOST);
	return 0;
}

#endif
