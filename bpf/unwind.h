/* The user-stack walk behind every stack refcntd records.
 *
 * The walk fills a stack_rec with return addresses (ip[]) and, per frame, the
 * module's build-id and file offset (frame[]), so a stack stays symbolizable
 * after its process is gone, and says how it was obtained.
 *
 * Debian builds its libraries without frame pointers, so the walk steps
 * with each module's CFI, compiled by user space (refcntd/kernel/cfi.py)
 * into sorted rows in cfi_rows, found by binary search (the approach of the
 * OpenTelemetry eBPF profiler and parca-agent).  Frame pointers remain the
 * step in modules that keep them (MOD_FP), and the guess in modules with
 * no table.  Which module a pc is in comes from execmaps.h.  bcc 0.26 cannot
 * relocate the callbacks of bpf_loop/bpf_find_vma, so all loops are bounded
 * loops.  The walk runs in its own programs (on_unwind, on_unwind_more in
 * refcntd.c), with knob `unwind`; without it, the kernel's frame-pointer walk.
 *
 * Sizes (-D): MAX_CFI_ROWS, MAX_MODULES.
 */
#ifndef REFCNTD_UNWIND_H
#define REFCNTD_UNWIND_H

/* Frames the CFI walk follows, UNWIND_CHUNK per program run: one program
 * walking 32 frames exceeds the verifier's 1M-instruction budget on 6.18. */
#ifndef UNWIND_DEPTH
#define UNWIND_DEPTH STACK_DEPTH
#endif
#ifndef UNWIND_CHUNK
#define UNWIND_CHUNK 6
#endif
/* The x86-64 PLT's CFA expression: rsp + 8, + 8 more from the entry's push on */
#define PLT_ENTRY_SIZE 16
#define PLT_PUSHED_AT 11

BPF_ARRAY(cfi_rows, struct cfi_row, MAX_CFI_ROWS);
BPF_HASH(cfi_modules, struct file_key, struct cfi_module, MAX_MODULES);

/* Frame-pointer walk by the kernel: 0, or -1 when the stack could not be read. */
static __always_inline int unwind_fp(struct pt_regs *ctx, struct stack_rec *rec)
{
	long n = bpf_get_stack(ctx, rec->ip, sizeof(rec->ip), BPF_F_USER_STACK);
	if (n <= 0)
		return -1;
	long m = bpf_get_stack(ctx, rec->frame, sizeof(rec->frame),
			       BPF_F_USER_STACK | BPF_F_USER_BUILD_ID);
	__u32 nr = n / sizeof(rec->ip[0]);
	if (m >= 0 && m / sizeof(rec->frame[0]) < nr)
		nr = m / sizeof(rec->frame[0]);
	rec->nr = nr;
	rec->method = UW_FP;
	rec->truncated = nr >= STACK_DEPTH ? TR_DEPTH : TR_NONE;
	rec->truncated_at = nr;
	return nr ? 0 : -1;
}

/* Copies the last row of `mod` whose pc is <= off into *out; 0 if none. */
static __always_inline int unwind_find_row(struct cfi_module *mod, __u32 off, struct cfi_row *out)
{
	__u32 lo = 0, hi = mod->count, idx = mod->first;
	struct cfi_row *row = cfi_rows.lookup(&idx);
	if (!hi || !row || row->pc > off)
		return 0;
	for (int s = 0; s < CFI_SEARCH_STEPS; s++) {
		if (lo + 1 >= hi)
			break;
		__u32 mid = lo + (hi - lo) / 2;
		idx = mod->first + mid;
		row = cfi_rows.lookup(&idx);
		if (!row)
			return 0;
		if (row->pc <= off)
			lo = mid;
		else
			hi = mid;
	}
	idx = mod->first + lo;
	row = cfi_rows.lookup(&idx);
	if (!row)
		return 0;
	__builtin_memcpy(out, row, sizeof(*out));
	return 1;
}

static __always_inline void unwind_put_frame(struct stack_rec *rec, __u32 i, __u64 pc, __u64 off,
					     struct cfi_module *mod, struct file_key *file,
					     __u64 start)
{
	if (i >= STACK_DEPTH)
		return;
	rec->nr = i + 1;
	rec->ip[i] = pc;
	if (!mod && !file->ino && !file->dev) {  /* anonymous executable memory: JIT code */
		rec->frame[i].offset = pc;  /* named from /tmp/perf-PID.map, by address */
		rec->frame[i].status = BPF_STACK_BUILD_ID_IP;
		return;
	}
	rec->frame[i].offset = off;
	/* no table yet (a library dlopen'ed just now): the file identifies it */
	__u64 id[3] = {file->ino, file->dev, 0};
	__builtin_memcpy(rec->frame[i].build_id, mod ? (void *)mod->build_id : (void *)id, 20);
	rec->frame[i].status = mod ? BPF_STACK_BUILD_ID_VALID : off == pc - start ? FRAME_EXE_TEXT
									   : FRAME_FILE;
}

struct unwind_regs {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 used;    /* bit 0: a frame-pointer step, bit 1: a CFI step */
	__u32 stop;    /* enum refcntd_trunc + 1 once the walk ends */
	__u64 ri;      /* the thread's next pending uretprobe (struct return_instance *) */
	__u64 tramp;   /* the uretprobe trampoline's address, 0: none pending */
};

/* A return probe pending in this thread (refcntd's own, on a constructor that returns
 * its object) has replaced its function's return address on the stack with the
 * trampoline in the [uprobes] page, outside every executable mapping: every stack
 * taken under such a function stopped there (1450 stacks of `openssl x509`, under
 * d2i_X509).  As the kernel's fixup_uretprobe_trampoline_entries() does for perf's
 * callchains, each trampoline met is replaced by its instance's orig_ret_vaddr,
 * matched by the stack slot it was read from.  The offsets are optional (off_ri_orig_ret
 * 0: BTF lacks them), the walk then stops there as before. */
#define URETPROBE_SKIP 4  /* pending instances passed over to find the slot's */
static __always_inline void unwind_pending_uretprobes(struct unwind_regs *r)
{
	struct refcntd_config *c = knobs();
	if (!c || !c->off_ri_orig_ret)
		return;
	__u64 task = bpf_get_current_task();
	r->ri = maps_kread(maps_kread(task + c->off_task_utask) + c->off_utask_ri);
	if (r->ri)
		r->tramp = maps_kread(maps_kread(maps_kread(task + c->off_task_mm) +
						 c->off_mm_uprobes + c->off_uprobes_xol) +
				      c->off_xol_vaddr);
}

/* r->pc is the trampoline read at r->sp - 8: the return address it replaced, or 0. */
static __always_inline __u64 unwind_uretprobe_return(struct unwind_regs *r)
{
	struct refcntd_config *c = knobs();
	if (!c)
		return 0;
	__u64 slot = r->sp - 8;
	for (__u32 k = 0; k < URETPROBE_SKIP; k++) {
		bounded(k);
		__u64 ri = r->ri;
		if (!ri)
			return 0;
		__u64 stack = maps_kread(ri + c->off_ri_stack);
		if (stack > slot)
			return 0;
		r->ri = maps_kread(ri + c->off_ri_next);
		if (stack == slot)
			return maps_kread(ri + c->off_ri_orig_ret);
	}
	return 0;
}

/* The caller's registers from a CFI row; returns 0, or a truncation reason + 1. */
static __always_inline __u32 unwind_step_cfi(struct unwind_regs *r, struct cfi_row *row)
{
	__u64 cfa;
	switch (row->cfa) {
	case CFA_RSP: cfa = r->sp + row->cfa_off; break;
	case CFA_RBP: cfa = r->bp + row->cfa_off; break;
	case CFA_PLT: cfa = r->sp + 8 + ((r->pc % PLT_ENTRY_SIZE) >= PLT_PUSHED_AT ? 8 : 0); break;
	case CFA_END: return TR_NONE + 1;
	default: return TR_BAD_RULE + 1;
	}
	__u64 ra = 0, bp = r->bp;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) != 0)
		return TR_UNREADABLE + 1;
	if (row->rbp_off && bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + row->rbp_off)))
		return TR_UNREADABLE + 1;
	r->pc = ra, r->sp = cfa, r->bp = bp;
	r->used |= 2;
	return ra ? 0 : TR_NONE + 1;
}

/* no_table: the module has no row here and no frame pointers: stepping by rbp is a
 * guess, and when it fails the stack was cut for want of a table, not a bad read. */
static __always_inline __u32 unwind_step_fp(struct unwind_regs *r, __u32 no_table)
{
	__u64 pair[2] = {};  /* saved rbp, return address */
	if (!r->bp)
		return (no_table ? TR_NO_TABLE : TR_NONE) + 1;
	if (bpf_probe_read_user(pair, sizeof(pair), (void *)r->bp) != 0)
		return (no_table ? TR_NO_TABLE : TR_UNREADABLE) + 1;
	r->pc = pair[1], r->sp = r->bp + 16, r->bp = pair[0];
	r->used |= 1;
	return pair[1] ? 0 : (no_table ? TR_NO_TABLE : TR_NONE) + 1;  /* a guess read 0 */
}

/* One frame: record pc, then step to the caller; 0 or a truncation reason + 1. */
static __always_inline __u32 unwind_frame(struct stack_rec *rec, struct exec_maps *maps,
					  struct unwind_regs *r, __u32 i, struct exec_map *m,
					  __u32 *guessed)
{
	if (r->tramp && r->pc == r->tramp && i > 0)
		r->pc = unwind_uretprobe_return(r);
	if (!maps_find(maps, r->pc, m))
		return (*guessed ? TR_NO_TABLE : TR_OUTSIDE) + 1;
	struct cfi_module *mod = cfi_modules.lookup(&m->file);
	__u64 off = maps_file_offset(m, mod, r->pc);
	unwind_put_frame(rec, i, r->pc, off, mod, &m->file, m->pgoff == EXE_PGOFF ? m->start : 0);
	__u32 no_table = !mod || !(mod->flags & MOD_FP);
	*guessed = no_table;
	if (mod && mod->count && !(i > 0 && (mod->flags & MOD_FP))) {
		struct cfi_row row = {};
		if (unwind_find_row(mod, i ? off - 1 : off, &row) && row.cfa != CFA_NONE) {
			*guessed = 0;
			return unwind_step_cfi(r, &row);  /* a return address: look up the call */
		}
	}
	return unwind_step_fp(r, no_table);
}

/* The walk's state between the programs that continue it (on_unwind_more). */
struct unwind_state {
	struct unwind_regs r;
	struct exec_map m;     /* the previous frame's mapping */
	__u32 guessed;         /* the previous step guessed with frame pointers (no table) */
	__u32 next;            /* index of the next frame */
};
BPF_PERCPU_ARRAY(unwind_states, struct unwind_state, 1);

/* Up to UNWIND_CHUNK frames from st->next; 0: not done, else truncation reason + 1. */
static __always_inline __u32 unwind_chunk(struct stack_rec *rec, struct exec_maps *maps,
					  struct unwind_state *st)
{
	for (__u32 j = 0; j < UNWIND_CHUNK; j++) {
		bounded(j);
		__u32 i = st->next;
		if (i >= UNWIND_DEPTH)
			return TR_DEPTH + 1;
		__u32 s = unwind_frame(rec, maps, &st->r, i, &st->m, &st->guessed);
		st->next = i + 1;
		if (s)
			return s;
	}
	return 0;
}

#endif
