/* The user-stack walk behind every stack refcntd records.
 *
 * Pasted into refcntd.c by the loader after stackstore.h.  The walk
 * fills a stack_rec with return addresses (ip[]) and, per frame, the
 * module's build-id and file offset (frame[]), so a stack stays
 * symbolizable after its process is gone, and says how it was obtained.
 *
 * Debian builds its libraries without frame pointers, so the walk steps
 * with each module's CFI, compiled by user space (refcntd/binary/cfi.py)
 * into sorted rows in cfi_rows, found by binary search (the approach of the
 * OpenTelemetry eBPF profiler and parca-agent).  Frame pointers remain the
 * step in modules that keep them (MOD_FP), and the guess in modules with
 * no table.  Which module a pc is in comes from exec_maps, kept here from
 * exec, mmap(PROT_EXEC) and munmap, so it is right for a process that
 * lives a few milliseconds and across dlopen/dlclose (a /proc/PID/maps
 * snapshot loses that race).  bcc 0.26 cannot relocate the callbacks of
 * bpf_loop/bpf_find_vma, so all loops are bounded loops.
 *
 * Knobs (-D): UNWIND 1: CFI unwinding on (needs the BTF offsets below);
 * MAX_CFI_ROWS, MAX_MODULES; OFF_TASK_MM, OFF_TASK_FILES, OFF_MM_START_CODE,
 * OFF_MM_END_CODE, OFF_MM_EXE_FILE, OFF_FILES_FDT, OFF_FDT_FD,
 * OFF_FILE_INODE, OFF_INODE_INO, OFF_INODE_SB, OFF_SB_DEV; optional:
 * OFF_TASK_UTASK, OFF_UTASK_RI, OFF_RI_STACK, OFF_RI_ORIG_RET, OFF_RI_NEXT,
 * OFF_MM_UPROBES, OFF_UPROBES_XOL, OFF_XOL_VADDR (pending uretprobes).
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

/* Frames the CFI walk follows, UNWIND_CHUNK per program run: one program
 * walking 32 frames exceeds the verifier's 1M-instruction budget on 6.18. */
#ifndef UNWIND_DEPTH
#define UNWIND_DEPTH STACK_DEPTH
#endif
#ifndef UNWIND_CHUNK
#define UNWIND_CHUNK 12
#endif

#if UNWIND
BPF_ARRAY(cfi_rows, struct cfi_row, MAX_CFI_ROWS);
BPF_HASH(cfi_modules, struct file_key, struct cfi_module, MAX_MODULES);
BPF_F_TABLE("hash", __u32, struct exec_maps, exec_maps, MAX_PROCS, BPF_F_NO_PREALLOC);
BPF_HASH(pending_mmap, __u32, struct mmap_args, 4096);
BPF_PERCPU_ARRAY(maps_scratch, struct exec_maps, 1);

static __always_inline __u64 kread(__u64 addr)
{
	__u64 value = 0;
	if (addr)
		bpf_probe_read_kernel(&value, sizeof(value), (void *)addr);
	return value;
}

static __always_inline void file_identity(__u64 file, struct file_key *key)
{
	__u64 inode = kread(file + OFF_FILE_INODE);
	key->ino = kread(inode + OFF_INODE_INO);
	key->dev = (__u32)kread(kread(inode + OFF_INODE_SB) + OFF_SB_DEV);
	key->pad = 0;
}

/* Copies the mapping holding pc into *out; 0 when there is none.  Results
 * leave the loops as copies, never as indexes, so the verifier can prune
 * the states of different iterations (it explores each loop exit apart). */
static __always_inline int find_map(struct exec_maps *maps, __u64 pc, struct exec_map *out)
{
	if (pc >= out->start && pc < out->end)  /* the previous frame's mapping */
		return 1;
	int found = 0;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {
		bounded(i);
		if (i >= maps->n)
			break;
		if (pc >= maps->m[i].start && pc < maps->m[i].end) {
			__builtin_memcpy(out, &maps->m[i], sizeof(*out));
			found = 1;
			break;
		}
	}
	return found;
}

/* The file offset of pc in mapping m (the executable's text mapping records
 * EXE_PGOFF: its offset is the text's, from the module's table). */
static __always_inline __u64 file_offset_in(struct exec_map *m, struct cfi_module *mod, __u64 pc)
{
	__u64 pgoff = m->pgoff == EXE_PGOFF ? (mod ? mod->text_off : 0) : m->pgoff;
	return pc - m->start + pgoff;
}

/* Copies the last row of `mod` whose pc is <= off into *out; 0 if none. */
static __always_inline int find_row(struct cfi_module *mod, __u32 off, struct cfi_row *out)
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

static __always_inline void put_frame(struct stack_rec *rec, __u32 i, __u64 pc, __u64 off,
				      struct cfi_module *mod, struct file_key *file, __u64 start)
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

/* A uretprobe pending in a frame (refcntd's own, on constructors returning the
 * object: d2i_X509 under PEM_read_bio_X509) replaced that frame's return
 * address on the stack with the trampoline in the [uprobes] page, outside
 * every executable mapping, where the walk would end.  The kernel keeps the
 * original in the thread's return_instance list, innermost first, each with
 * the stack slot it hijacked (rsp at the function's entry); as
 * fixup_uretprobe_trampoline_entries() does for perf's callchains, each
 * trampoline met is replaced by its instance's orig_ret_vaddr, matched by slot
 * (instances of frames already left are passed over; a chained instance,
 * tail call to another probed function, has the same slot and orig). */
#define URETPROBE_SKIP 4
#ifdef OFF_RI_ORIG_RET
static __always_inline void pending_uretprobes(struct unwind_regs *r)
{
	__u64 task = bpf_get_current_task();
	r->ri = kread(kread(task + OFF_TASK_UTASK) + OFF_UTASK_RI);
	if (r->ri)
		r->tramp = kread(kread(kread(task + OFF_TASK_MM) + OFF_MM_UPROBES + OFF_UPROBES_XOL)
				 + OFF_XOL_VADDR);
}

/* r->pc is the trampoline read at r->sp - 8: the return address it replaced, or 0. */
static __always_inline __u64 uretprobe_return(struct unwind_regs *r)
{
	__u64 slot = r->sp - 8;
	for (__u32 k = 0; k < URETPROBE_SKIP; k++) {
		bounded(k);
		__u64 ri = r->ri;
		if (!ri)
			return 0;
		__u64 stack = kread(ri + OFF_RI_STACK);
		if (stack > slot)
			return 0;
		r->ri = kread(ri + OFF_RI_NEXT);
		if (stack == slot)
			return kread(ri + OFF_RI_ORIG_RET);
	}
	return 0;
}
#else
static __always_inline void pending_uretprobes(struct unwind_regs *r) {}
static __always_inline __u64 uretprobe_return(struct unwind_regs *r) { return 0; }
#endif

/* The caller's registers from a CFI row; returns 0, or a truncation reason + 1. */
static __always_inline __u32 step_cfi(struct unwind_regs *r, struct cfi_row *row)
{
	__u64 cfa;
	switch (row->cfa) {
	case CFA_RSP: cfa = r->sp + row->cfa_off; break;
	case CFA_RBP: cfa = r->bp + row->cfa_off; break;
	case CFA_PLT: cfa = r->sp + 8 + ((r->pc & 15) >= 11 ? 8 : 0); break;
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
static __always_inline __u32 step_fp(struct unwind_regs *r, __u32 no_table)
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
		r->pc = uretprobe_return(r);
	if (!find_map(maps, r->pc, m))
		return (*guessed ? TR_NO_TABLE : TR_OUTSIDE) + 1;
	struct cfi_module *mod = cfi_modules.lookup(&m->file);
	__u64 off = file_offset_in(m, mod, r->pc);
	put_frame(rec, i, r->pc, off, mod, &m->file, m->pgoff == EXE_PGOFF ? m->start : 0);
	__u32 no_table = !mod || !(mod->flags & MOD_FP);
	*guessed = no_table;
	if (mod && mod->count && !(i > 0 && (mod->flags & MOD_FP))) {
		struct cfi_row row = {};
		if (find_row(mod, i ? off - 1 : off, &row) && row.cfa != CFA_NONE) {
			*guessed = 0;
			return step_cfi(r, &row);  /* a return address: look up the call */
		}
	}
	return step_fp(r, no_table);
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
static __always_inline __u32 walk_chunk(struct stack_rec *rec, struct exec_maps *maps,
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

/* ---- executable mappings of each process -------------------------------- */
static __always_inline int tracked(__u32 tgid)
{
	return !FILTERED || procs.lookup(&tgid);
}

static __always_inline void add_map(__u32 tgid, __u64 start, __u64 end, __u64 pgoff,
				    struct file_key *file)
{
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	if (!maps) {
		int zero = 0;
		struct exec_maps *blank = maps_scratch.lookup(&zero);
		if (!blank)
			return;
		blank->n = 0;
		exec_maps.update(&tgid, blank);
		maps = exec_maps.lookup(&tgid);
		if (!maps)
			return;
	}
	__u32 slot = maps->n;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {  /* MAP_FIXED over an old mapping */
		bounded(i);
		if (i >= maps->n)
			break;
		if (maps->m[i].start < end && start < maps->m[i].end) {
			slot = i;
			break;
		}
	}
	if (slot >= MAX_EXEC_MAPS) {
		count_stat(ST_EXEC_MAPS_FULL);
		return;
	}
	maps->m[slot].start = start;
	maps->m[slot].end = end;
	maps->m[slot].pgoff = pgoff;
	maps->m[slot].file = *file;
	if (slot == maps->n)
		maps->n = slot + 1;
}

#if HOLD
/* Defined in refcntd.c (it sends an event): see the comment there. */
static __always_inline void hold_if_unvetted(__u32 tgid, struct file_key *file);
#else
#define hold_if_unvetted(tgid, file) do {} while (0)
#endif

TRACEPOINT_PROBE(sched, sched_process_exec)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!tracked(tgid))
		return 0;
	exec_maps.delete(&tgid);
	__u64 mm = kread(bpf_get_current_task() + OFF_TASK_MM);
	struct file_key file = {};
	file_identity(kread(mm + OFF_MM_EXE_FILE), &file);
	add_map(tgid, kread(mm + OFF_MM_START_CODE), kread(mm + OFF_MM_END_CODE), EXE_PGOFF,
		&file);
	hold_if_unvetted(tgid, &file);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap)
{
	__u64 id = bpf_get_current_pid_tgid();
	/* PROT_EXEC, of a file or anonymous (MAP_ANONYMOUS: JIT code) */
	if (!(args->prot & 4) || ((int)args->fd < 0 && !(args->flags & 0x20)) ||
	    !tracked(id >> 32))
		return 0;
	struct mmap_args a = {.len = args->len, .off = args->off, .fd = args->fd};
	__u32 tid = (__u32)id;
	pending_mmap.update(&tid, &a);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_mmap)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	struct mmap_args *a = pending_mmap.lookup(&tid);
	if (!a)
		return 0;
	struct mmap_args saved = *a;
	pending_mmap.delete(&tid);
	if (args->ret < 0 || (__u64)args->ret >= (__u64)-4096)
		return 0;
	struct file_key file = {};  /* all zero: anonymous */
	if (saved.fd >= 0) {
		__u64 files = kread(bpf_get_current_task() + OFF_TASK_FILES);
		__u64 fds = kread(kread(files + OFF_FILES_FDT) + OFF_FDT_FD);
		file_identity(kread(fds + 8 * (__u64)(__u32)saved.fd), &file);
	}
	add_map(id >> 32, args->ret, args->ret + saved.len, saved.fd >= 0 ? saved.off : 0, &file);
	if (saved.fd >= 0)
		hold_if_unvetted(id >> 32, &file);
	return 0;
}

/* W^X JITs write code, then mprotect it executable: followed like an anonymous
 * mmap(PROT_EXEC), unless a mapping already covers it (a file's text). */
TRACEPOINT_PROBE(syscalls, sys_enter_mprotect)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!(args->prot & 4) || !tracked(tgid))
		return 0;
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	struct exec_map seen = {};
	if (maps && find_map(maps, args->start, &seen))
		return 0;
	struct file_key anon = {};
	add_map(tgid, args->start, args->start + args->len, 0, &anon);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_munmap)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct exec_maps *maps = exec_maps.lookup(&tgid);
	if (!maps)
		return 0;
	__u64 start = args->addr, end = args->addr + args->len;
	for (__u32 i = 0; i < MAX_EXEC_MAPS; i++) {  /* dlclose: forget what it unmaps */
		bounded(i);
		if (i >= maps->n)
			break;
		if (maps->m[i].start >= start && maps->m[i].end <= end)
			maps->m[i].end = maps->m[i].start;  /* empty: never matches */
	}
	return 0;
}

static __always_inline void maps_fork(__u32 parent, __u32 child)
{
	struct exec_maps *maps = exec_maps.lookup(&parent);
	if (maps)
		exec_maps.update(&child, maps);
}

static __always_inline void maps_exit(__u32 tgid)
{
	exec_maps.delete(&tgid);
}

#else
static __always_inline void maps_fork(__u32 parent, __u32 child) {}
static __always_inline void maps_exit(__u32 tgid) {}
#endif

/* Keeps a walked stack (ok: the walk produced frames); its key, 0 if not kept. */
static __always_inline __u64 keep_stack(struct stack_rec *rec, int ok)
{
	if (!ok) {
		count_stat(ST_STACK_UNREAD);
		return 0;
	}
	if (rec->truncated != TR_NONE && rec->truncated <= TR_BAD_RULE)
		count_stat(ST_TRUNC_NO_TABLE + rec->truncated - TR_NO_TABLE);
	return store_stack(rec);
}

static __always_inline struct stack_rec *new_stack_rec(void)
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

/* The CFI walk is verified once, in its own programs: inlined at every place
 * a stack is taken it exceeds the verifier's budget.  on_probe tail-calls
 * on_unwind when the probe's role records a stack (init; every role with
 * history); on_unwind walks UNWIND_CHUNK frames and tail-calls
 * on_unwind_more for each further chunk; the last leaves the stack's key in
 * probe_stack and tail-calls on_body, the probe's logic, which takes the
 * key from there.  Where no key was left (a get/put anomaly without
 * history), the body takes the kernel's frame-pointer walk. */
BPF_PROG_ARRAY(probe_progs, 3);
BPF_PERCPU_ARRAY(probe_stack, __u64, 1);
#define PROG_UNWIND 0
#define PROG_BODY 1
#define PROG_UNWIND_MORE 2

static __always_inline void set_probe_stack(__u64 key)
{
	int zero = 0;
	__u64 *slot = probe_stack.lookup(&zero);
	if (slot)
		*slot = key;
}

/* The stack at the probe: from on_unwind, else the frame-pointer walk. */
static __always_inline __u64 record_stack(struct pt_regs *ctx)
{
	int zero = 0;
	__u64 *slot = probe_stack.lookup(&zero);
	if (slot && *slot)
		return *slot;
	struct stack_rec *rec = new_stack_rec();
	return rec ? keep_stack(rec, walk_frame_pointers(ctx, rec) == 0) : 0;
}

static __always_inline int to_body(struct pt_regs *ctx, __u64 key)
{
	set_probe_stack(key);
	probe_progs.call(ctx, PROG_BODY);
	set_probe_stack(0);
	return 0;
}

#if UNWIND
static __always_inline int continue_unwind(struct pt_regs *ctx, struct stack_rec *rec,
					   struct exec_maps *maps, struct unwind_state *st)
{
	__u32 stop = walk_chunk(rec, maps, st);
	if (!stop && st->next < UNWIND_DEPTH)
		probe_progs.call(ctx, PROG_UNWIND_MORE);  /* returns only if it failed */
	if (!stop)
		stop = TR_DEPTH + 1;
	rec->truncated = stop - 1;
	rec->truncated_at = rec->nr;
	rec->method = st->r.used == 3 ? UW_MIXED : st->r.used == 2 ? UW_CFI : UW_FP;
	if (!rec->nr)  /* the pc is in no mapping we know: the kernel's walk */
		return to_body(ctx, keep_stack(rec, walk_frame_pointers(ctx, rec) == 0));
	return to_body(ctx, keep_stack(rec, 1));
}

int on_unwind(struct pt_regs *ctx)
{
	int zero = 0;
	struct stack_rec *rec = new_stack_rec();
	struct unwind_state *st = unwind_states.lookup(&zero);
	if (!rec || !st)
		return to_body(ctx, 0);
	struct exec_maps *maps = exec_maps.lookup(&rec->tgid);
	if (!maps)  /* not seen exec'ing and not seeded */
		return to_body(ctx, keep_stack(rec, walk_frame_pointers(ctx, rec) == 0));
	__builtin_memset(st, 0, sizeof(*st));
	st->r.pc = PT_REGS_IP(ctx);
	st->r.sp = PT_REGS_SP(ctx);
	st->r.bp = PT_REGS_FP(ctx);
	pending_uretprobes(&st->r);
	return continue_unwind(ctx, rec, maps, st);
}

int on_unwind_more(struct pt_regs *ctx)
{
	int zero = 0;
	struct stack_rec *rec = stack_scratch.lookup(&zero);
	struct unwind_state *st = unwind_states.lookup(&zero);
	struct exec_maps *maps = rec ? exec_maps.lookup(&rec->tgid) : 0;
	if (!rec || !st || !maps)
		return to_body(ctx, 0);
	return continue_unwind(ctx, rec, maps, st);
}
#else
int on_unwind(struct pt_regs *ctx)
{
	struct stack_rec *rec = new_stack_rec();
	return to_body(ctx, rec ? keep_stack(rec, walk_frame_pointers(ctx, rec) == 0) : 0);
}

int on_unwind_more(struct pt_regs *ctx)
{
	return to_body(ctx, 0);
}
#endif

#endif
