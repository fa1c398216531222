/* Where a probe finds its values (struct probe_cfg, one per probe, written by
 * user space): registers, memory they point to, constants, and a constructor's
 * arguments saved at its entry for its return probe.
 */
#ifndef REFCNTD_ARGS_H
#define REFCNTD_ARGS_H

/* x86-64 EFLAGS bits a conditional jump tests (arg_branch_taken) */
#define EFLAGS_CF 0
#define EFLAGS_PF 2
#define EFLAGS_ZF 6
#define EFLAGS_SF 7
#define EFLAGS_OF 11

BPF_ARRAY(probe_cfgs, struct probe_cfg, MAX_PROBES);
/* Keyed by arg_pending_key: a constructor called inside another (d2i_X509 making
 * the certificate's EVP_PKEY) saves its arguments beside the outer one's. */
BPF_HASH(pending_init, __u64, struct init_args, MAX_PROCS);

/* A thread's constructor `level` (ctor_depth at its entry, 1 outermost). */
static __always_inline __u64 arg_pending_key(__u32 level)
{
	return ((__u64)level << 32) | (__u32)bpf_get_current_pid_tgid();
}

/* The verifier refuses a ctx load at a computed offset, so a register is
 * read with one probe read of the saved pt_regs at its offset. */
static __always_inline __u64 arg_fetch(struct pt_regs *ctx, struct arg_loc *loc)
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

/* A call-site probe on `jcc func` counts only when the jump is taken: the
 * kernel emulates the jcc after us, on the same flags.  `cond` is 0x10 | the
 * x86 condition code: its bits 1-3 pick the test, bit 0 negates it. */
static __always_inline int arg_branch_taken(struct pt_regs *ctx, __u32 cond)
{
	__u64 f = ctx->flags;
	int cf = (f >> EFLAGS_CF) & 1, pf = (f >> EFLAGS_PF) & 1, zf = (f >> EFLAGS_ZF) & 1;
	int sf = (f >> EFLAGS_SF) & 1, of = (f >> EFLAGS_OF) & 1, r;
	switch ((cond & 0xf) >> 1) {
	case 0: r = of; break;              /* jo */
	case 1: r = cf; break;              /* jb */
	case 2: r = zf; break;              /* je */
	case 3: r = cf | zf; break;         /* jbe */
	case 4: r = sf; break;              /* js */
	case 5: r = pf; break;              /* jp */
	case 6: r = sf != of; break;        /* jl */
	default: r = zf | (sf != of); break;  /* jle */
	}
	return (cond & 1) ? !r : r;
}

/* The type-name pointer: an argument, or loaded from a class structure it
 * points to (type_deref: offset + 1 per pointer load). */
static __always_inline __u64 arg_type_pointer(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	if (!cfg->type.kind)
		return 0;
	__u64 ptr = arg_fetch(ctx, &cfg->type);
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
static __always_inline __u64 arg_init_object(struct pt_regs *ctx, struct probe_cfg *cfg,
					     struct init_args *args)
{
	__u64 obj = 0;
	if (!(cfg->flags & PF_OBJ_OUT))
		return arg_fetch(ctx, &cfg->obj);
	if (args->out_ptr)
		bpf_probe_read_user(&obj, sizeof(obj), (void *)args->out_ptr);
	return obj;
}

/* At a constructor's entry: the out-pointer (PF_OBJ_OUT; with PF_REUSES_ARG the
 * pointer to the object it is given to reuse) and that object, *pointer. */
static __always_inline void arg_save_pointers(struct pt_regs *ctx, struct probe_cfg *cfg,
					      struct init_args *args)
{
	if (!(cfg->flags & (PF_OBJ_OUT | PF_REUSES_ARG)))
		return;
	__u64 ptr = arg_fetch(ctx, &cfg->obj);
	args->out_ptr = ptr;
	if ((cfg->flags & PF_REUSES_ARG) && ptr)
		bpf_probe_read_user(&args->existing, sizeof(args->existing), (void *)ptr);
}

/* Arguments of an init: read now, or saved by the constructor's entry probe
 * when this is its return probe (the registers are gone by then). */
static __always_inline int arg_init_args(struct pt_regs *ctx, struct probe_cfg *cfg,
					 struct init_args *out, __u32 level)
{
	out->type_ptr = arg_type_pointer(ctx, cfg);
	out->count = cfg->count.kind ? (__s64)arg_fetch(ctx, &cfg->count) : cfg->fixed_count;
	out->out_ptr = 0;
	out->existing = 0;
	if (!cfg->is_return ||
	    (!cfg->type.kind && !cfg->count.kind && !(cfg->flags & (PF_OBJ_OUT | PF_REUSES_ARG))))
		return 0;
	__u64 key = arg_pending_key(level);
	struct init_args *saved = pending_init.lookup(&key);
	if (!saved) {
		stat_count(ST_INIT_ARGS_LOST);
		return -1;
	}
	out->type_ptr = cfg->type.kind ? saved->type_ptr : 0;
	out->count = cfg->count.kind ? saved->count : cfg->fixed_count;
	out->out_ptr = saved->out_ptr;
	out->existing = saved->existing;
	pending_init.delete(&key);
	return 0;
}

#endif
