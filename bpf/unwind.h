/* The user-stack walk behind every stack refcntd records.
 *
 * Included by refcntd.c after stackstore.h.  walk_stack() fills a stack_rec
 * with return addresses (ip[]) and, per frame, the module's build-id and file
 * offset (frame[]), so a stack stays symbolizable after its process is gone.
 */
#ifndef REFCNTD_UNWIND_H
#define REFCNTD_UNWIND_H

/* Frame-pointer walk by the kernel: 0, or -1 when the stack could not be read. */
static __always_inline int walk_frame_pointers(struct pt_regs *ctx, struct stack_rec *rec)
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

/* The current user stack, stored; its key in stack_store, 0 when not recorded. */
static __always_inline __u64 record_stack(struct pt_regs *ctx)
{
	int zero = 0;
	struct stack_rec *rec = stack_scratch.lookup(&zero);
	if (!rec)
		return 0;
	rec->tgid = bpf_get_current_pid_tgid() >> 32;
	struct proc_val *proc = procs.lookup(&rec->tgid);
	rec->gen = proc ? proc->gen : 0;
	if (walk_frame_pointers(ctx, rec) != 0) {
		count_stat(ST_STACK_UNREAD);
		return 0;
	}
	return store_stack(rec);
}

#endif
