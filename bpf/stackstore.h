/* The content-addressed stack store: every user stack refcntd records.
 *
 * BPF_MAP_TYPE_STACK_TRACE keys a stack by a hash bucket and refuses a stack
 * whose bucket holds another one (7 585 of ~18 000 stacks lost at 1 000 short
 * processes).  Here the key is a 64-bit hash of (tgid, gen, frames): the same
 * stack of the same process always lands on the same entry, and a different
 * stack only does when 64-bit hashes collide, which the insert detects by
 * comparing the frames (counted as ST_STACK_COLLISION).  The hash mixes each
 * word's high bits down (stack_mix, stack_finish): FNV-1a's multiply alone, used
 * before, carries a difference only upward, and frames that differ in their top
 * bits collided by construction (issue 54: the kernel's frame-pointer walk through
 * code without frame pointers records garbage such as 0x0f00000000006765 beside
 * 0x0100000000006765, each as ip and offset, and the two shared a key).  A full
 * store is counted (ST_STACK_LOST).  Each entry belongs to one process generation
 * (proc_stacks), so user space frees exactly that process's stacks once its
 * report is written.
 *
 * The walk itself (frame pointers and CFI) is in unwind.h.
 */
#ifndef REFCNTD_STACKSTORE_H
#define REFCNTD_STACKSTORE_H

#define STACK_HASH_SEED 0x9e3779b97f4a7c15ULL  /* 2^64 / golden ratio: any odd constant */
#define STACK_MIX_K1 0xbf58476d1ce4e5b9ULL     /* splitmix64's finalizer (Stafford's mix 13) */
#define STACK_MIX_K2 0x94d049bb133111ebULL

BPF_F_TABLE("hash", __u64, struct stack_rec, stack_store, MAX_STACKS, BPF_F_NO_PREALLOC);
BPF_HASH(proc_stacks, struct proc_stack, __u32, MAX_STACKS);  /* owner -> process gen */
BPF_PERCPU_ARRAY(stack_scratch, struct stack_rec, 1);

/* Hide a loop counter from LLVM so it keeps the constant bound test the
 * verifier needs (it may otherwise merge it with the data-dependent one). */
#define bounded(i) asm volatile("" : "+r"(i))

/* The hash with one more word: a multiply carries the word's bits upward, the
 * xorshift brings the top half down, where the next multiply spreads it again.
 * Each step is a bijection of the hash: two stacks that differ in one word never
 * collide.  One step, not a full finalizer per word: on_body's verification costs
 * 123 000 instructions so, 144 000 with splitmix64's per word (116 000 with FNV). */
static __always_inline __u64 stack_mix(__u64 hash, __u64 word)
{
	__u64 x = (hash ^ word) * STACK_MIX_K1;
	return x ^ (x >> 32);
}

/* The last step, once per stack: splitmix64's finalizer, every bit over every other. */
static __always_inline __u64 stack_finish(__u64 x)
{
	x = (x ^ (x >> 30)) * STACK_MIX_K1;
	x = (x ^ (x >> 27)) * STACK_MIX_K2;
	return x ^ (x >> 31);
}

static __always_inline __u64 stack_hash(struct stack_rec *rec)
{
	__u64 hash = stack_mix(STACK_HASH_SEED, ((__u64)rec->gen << 32) | rec->tgid);
	hash = stack_mix(hash, rec->nr);
	for (__u32 i = 0; i < STACK_DEPTH; i++) {
		bounded(i);
		if (i >= rec->nr)
			break;
		hash = stack_mix(hash, rec->ip[i]);
		hash = stack_mix(hash, rec->frame[i].offset);
	}
	return stack_finish(hash) | 1;  /* 0 means "no stack" */
}

static __always_inline int stack_same(struct stack_rec *a, struct stack_rec *b)
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
static __always_inline __u64 stack_insert(struct stack_rec *rec)
{
	__u64 key = stack_hash(rec);
	struct stack_rec *old = stack_store.lookup(&key);
	if (old) {
		if (stack_same(old, rec))
			return key;
		stat_count(ST_STACK_COLLISION);
		return 0;
	}
	struct proc_stack owner = {.tgid = rec->tgid, .stack_id = key};
	__u32 gen = rec->gen;
	if (proc_stacks.update(&owner, &gen) != 0) {
		stat_count(ST_STACK_LOST);
		return 0;
	}
	int err = stack_store.insert(&key, rec);
	if (err == 0)
		return key;
	if (err == -EEXIST) {  /* another thread of the process stored it just now */
		old = stack_store.lookup(&key);
		if (old && stack_same(old, rec))
			return key;
		stat_count(ST_STACK_COLLISION);
		return 0;
	}
	proc_stacks.delete(&owner);
	stat_count(ST_STACK_LOST);
	return 0;
}

/* The CPU's scratch record, for the current process; no frames yet. */
static __always_inline struct stack_rec *stack_new(void)
{
	int zero = 0;
	struct stack_rec *rec = stack_scratch.lookup(&zero);
	if (!rec)
		return 0;
	rec->tgid = bpf_get_current_pid_tgid() >> 32;
	struct proc_val *proc = procs.lookup(&rec->tgid);
	rec->gen = proc ? proc->gen : 0;
	rec->nr = 0;
	return rec;
}

/* Keeps a walked stack (ok: the walk produced frames); its key, 0 if not kept. */
static __always_inline __u64 stack_keep(struct stack_rec *rec, int ok)
{
	if (!ok) {
		stat_count(ST_STACK_UNREAD);
		return 0;
	}
	if (rec->truncated != TR_NONE && rec->truncated <= TR_BAD_RULE)
		stat_count(ST_TRUNC_NO_TABLE + rec->truncated - TR_NO_TABLE);
	return stack_insert(rec);
}

#endif
