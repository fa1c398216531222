/* refcntd kernel side: count every object's references in a hash map.
 *
 * get and put are aggregated here and never send anything to user space;
 * only process lifecycle events and anomalies travel through the ring buffer,
 * in order.  This file holds the probe's entry points and the tail-call chain
 * (on_probe -> on_unwind [-> on_unwind_more ...] -> on_body), the roles that
 * change counts, and the process tracepoints; each other concern is a header,
 * its helpers named after it:
 *   knobs.h      the run-time configuration (struct refcntd_config)
 *   stats.h      counters of losses and notes      events.h   the ring buffer
 *   procs.h      traced processes, comm / cgroup filters
 *   args.h       where a probe finds its values    types.h    type names, totals
 *   stackstore.h recorded stacks                   execmaps.h a process's mappings
 *   unwind.h     the CFI stack walk                sites.h    per-site live counts
 *   history.h    get/put history                   objects.h  the object table
 *   anomaly.h    misuse reports                    hold.h     holding for call sites
 *   ldso.h       ld.so's loaded objects             exithold.h holding at _exit for a scan
 * The layouts they share with user space are in refcntd.h, the ABI.
 *
 * Built by refcntd/kernel/program.py: one compiled object for every option
 * set.  The -D flags only size maps (MAX_OBJECTS, MAX_STACKS, MAX_PROCS,
 * MAX_PROBES, MAX_TYPES, MAX_GRAVES, RINGBUF_PAGES and each header's own);
 * everything else is a knob (knobs.h), read at run time.
 */
#include <uapi/linux/ptrace.h>
/* EEXIST (stats.h, stackstore.h): Debian's 6.12 headers bring it in no other way */
#include <uapi/asm-generic/errno-base.h>

#include "refcntd.h"

/* bcc rewrites map calls in the main file only: kernel/program.py pastes these in. */
#include "knobs.h"  /* pasted in by kernel/program.py */
#include "stats.h"  /* pasted in by kernel/program.py */
#include "events.h"  /* pasted in by kernel/program.py */
#include "procs.h"  /* pasted in by kernel/program.py */
#include "args.h"  /* pasted in by kernel/program.py */
#include "types.h"  /* pasted in by kernel/program.py */
#include "stackstore.h"  /* pasted in by kernel/program.py */
#include "execmaps.h"  /* pasted in by kernel/program.py */
#include "unwind.h"  /* pasted in by kernel/program.py */

BPF_PERCPU_ARRAY(probe_hits, __u64, MAX_PROBES);  /* roles that never fire are reported */

/* ---- the tail-call chain ------------------------------------------------
 * The CFI walk is verified once, in its own programs: inlined at every place
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

static __always_inline int to_body(struct pt_regs *ctx, __u64 key)
{
	set_probe_stack(key);
	probe_progs.call(ctx, PROG_BODY);
	set_probe_stack(0);
	return 0;
}

/* The stack at the probe: the one on_unwind left, else, with `walk` (an anomaly
 * needs_stack did not foresee), the kernel's frame-pointer walk now.  Where
 * needs_stack asked for the stack (an init, any operation with history), on_unwind
 * has walked and counted any loss already: no second walk, and one inlined walk
 * fewer per call site (the inlined copies made most of the compile's time). */
static __always_inline __u64 record_stack(struct pt_regs *ctx, int walk)
{
	int zero = 0;
	__u64 *slot = probe_stack.lookup(&zero);
	if (slot && *slot)
		return *slot;
	if (!walk)
		return 0;
	struct stack_rec *rec = stack_new();
	return rec ? stack_keep(rec, unwind_fp(ctx, rec) == 0) : 0;
}

/* The stack, and the caller's return address where the walk misses it (a probe
 * before the callee's prologue: rbp is still the caller's). */
static __always_inline void capture_stacks(struct pt_regs *ctx, struct probe_cfg *cfg,
					   __u64 *stack_id, __u64 *caller_ip, int walk)
{
	*stack_id = record_stack(ctx, walk);
	*caller_ip = 0;
	if (cfg->caller_sp >= 0) {
		void *slot = (void *)(PT_REGS_SP(ctx) + (__u32)cfg->caller_sp);
		if (bpf_probe_read_user(caller_ip, sizeof(*caller_ip), slot) != 0)
			stat_count(ST_CALLER_UNREAD);
	}
}

#include "sites.h"  /* pasted in by kernel/program.py */
#include "history.h"  /* pasted in by kernel/program.py */
#include "objects.h"  /* pasted in by kernel/program.py */
#include "anomaly.h"  /* pasted in by kernel/program.py */
#include "hold.h"  /* pasted in by kernel/program.py */
#include "ldso.h"  /* pasted in by kernel/program.py */
#include "exithold.h"  /* pasted in by kernel/program.py */

/* ---- the roles ---------------------------------------------------------- */
static __always_inline int do_init_entry(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!proc_tracked(tgid))
		return 0;
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), level = 1;
	__u32 *depth = ctor_depth.lookup(&tid);
	if (depth)
		level = *depth += 1;  /* only this thread writes its entry */
	else
		ctor_depth.update(&tid, &level);
	struct init_args args = {};
	args.type_ptr = arg_type_pointer(ctx, cfg);
	args.count = cfg->count.kind ? (__s64)arg_fetch(ctx, &cfg->count) : 0;
	arg_save_pointers(ctx, cfg, &args);
	__u64 key = arg_pending_key(level);
	pending_init.update(&key, &args);
	return 0;
}

/* A put on the object at key->addr: by a put probe, or by a constructor that
 * failed to reuse the object it was given (PF_REUSES_ARG). */
static __always_inline int put_object(struct pt_regs *ctx, struct probe_cfg *cfg,
				      struct obj_key *k)
{
	struct obj_key key = *k;
	if (key.addr == 0 || obj_is_static(cfg, key.addr))
		return 0;
	struct grave_val g = {};
	__u32 kind = 0;
	__s64 before = 0;
	if (KNOB(absorbs_put) && obj_absorbed_put(&key))  /* a live object's inner put */
		return 0;
	if (cfg->flags & PF_ABSORBS_PUT) {  /* g_bytes_unref_to_data: g_bytes_unref inside, or not */
		__u32 tid = (__u32)bpf_get_current_pid_tgid();
		put_due.update(&key, &tid);
	}
	struct obj_val *o = obj_lookup(&key);
	if (!o) {
		if (obj_absorbed_put(&key) || obj_early_op(&key, -1))
			return 0;
		kind = anomaly_missing(cfg, &key, AN_PUT_AFTER_DELETE, AN_UNKNOWN_PUT,
				       ST_UNKNOWN_PUT, &g);
	} else {
		if (obj_set_aside(cfg, &key))
			return 0;
		__sync_fetch_and_add(&o->puts, 1);
		before = __sync_fetch_and_add(&o->count, -1);
		site_count_op(&key, o, OP_PUT);
		hist_record(ctx, cfg, &key, o, ROLE_PUT, before - 1);
		if (before <= 0) {
			stat_count(ST_PUT_BELOW_ZERO);
			g = obj_describe(o, 0);
			kind = before == 0 ? AN_DOUBLE_PUT : AN_NEGATIVE_COUNT;
		}
		if (before == 1 && (!KNOB(has_delete) || (cfg->flags & PF_FREES_AT_ZERO))) {
			__u32 tid = (__u32)bpf_get_current_pid_tgid();
			obj_release(&key, o);
			last_released.update(&tid, &key);
		}
	}
	if (kind)
		anomaly_report(ctx, cfg, kind, &key, before, &g);
	return 0;
}

/* PF_MAY_EXIST: a constructor returned an object that is already live (a
 * singleton; d2i_X509(&x, ...) decoding into x): that object, not a new one,
 * and a get on it with PF_EXISTING_GET.  With PF_REUSES_ARG only the object it
 * was given at entry is; any other return is a failure, which dropped that
 * object's reference when it also took it from the caller's pointer (d2i
 * frees it and sets *x = NULL).  1: handled, no new object. */
static __always_inline int init_existing(struct pt_regs *ctx, struct probe_cfg *cfg,
					 struct obj_key *key, struct init_args *args, __u32 gen)
{
	if (cfg->flags & PF_REUSES_ARG) {
		__u64 given = args->existing, now = 0;
		if (!given)
			return 0;
		if (given != key->addr) {
			bpf_probe_read_user(&now, sizeof(now), (void *)args->out_ptr);
			if (now == given)
				return 0;  /* still the caller's */
			struct obj_key dropped = {.tgid = key->tgid, .addr = given};
			stat_count(ST_REUSE_DROPPED);
			put_object(ctx, cfg, &dropped);
			return 0;
		}
	}
	struct obj_val *o = obj_lookup(key);
	if (!o || o->gen != gen)
		return 0;
	stat_count(ST_EXISTING_RETURNED);
	if (cfg->flags & PF_EXISTING_GET) {
		__s64 before = __sync_fetch_and_add(&o->count, 1);
		__sync_fetch_and_add(&o->gets, 1);
		site_count_op(key, o, OP_GET);
		hist_record(ctx, cfg, key, o, ROLE_GET, before + 1);
	}
	return 1;
}

static __always_inline int do_init(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u32 level = cfg->is_return ? obj_ctor_returned() : 0;
	/* a process found system-wide was registered by on_probe, before the stack walk */
	struct proc_val *proc = procs.lookup(&tgid);
	if (!proc || (proc->flags & PROC_IGNORED))
		return 0;
	struct init_args args = {};
	if (arg_init_args(ctx, cfg, &args, level) != 0)
		return 0;
	struct obj_key key = {.tgid = tgid, .addr = arg_init_object(ctx, cfg, &args)};
	if ((cfg->flags & PF_MAY_EXIST) && init_existing(ctx, cfg, &key, &args, proc->gen))
		return 0;
	if (key.addr == 0 || obj_is_static(cfg, key.addr))
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
		val.type_id = type_intern(args.type_ptr);
		if (!val.type_id)
			val.name_ptr = args.type_ptr;
	}
	val.gen = proc->gen;
	val.init_ns = bpf_ktime_get_ns();
	capture_stacks(ctx, cfg, &val.stack_id, &val.caller_ip, 0);  /* needs_stack: always */
	graveyard.delete(&key);
	unknown_seen.delete(&key);
	struct obj_val *old = objs.lookup(&key);
	if (old) {
		stat_count(old->gen == val.gen ? ST_REINIT_LIVE : ST_STALE_REPLACED);
		site_add(&key, old, -1, 0);
	}
	site_classify(&val);
	if (objs.update(&key, &val) != 0) {
		stat_count(ST_OBJ_MAP_FULL);
		return 0;
	}
	site_add(&key, &val, 1, 1);
	if (!(proc->flags & PROC_HAS_OBJECTS))
		proc->flags |= PROC_HAS_OBJECTS;  /* only ever set: a race sets the same bit */
	site_count_op(&key, &val, OP_INIT);
	hist_start(&key, val.type_id, val.init_ns);
	hist_record(ctx, cfg, &key, &val, ROLE_INIT, val.count);
	return 0;
}

static __always_inline int do_get(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = arg_fetch(ctx, &cfg->obj)};
	if (key.addr == 0 || obj_is_static(cfg, key.addr))  /* foo_free(NULL): a no-op */
		return 0;
	struct obj_val *o = obj_lookup(&key);
	if (!o) {
		struct grave_val g = {};
		__u32 kind = obj_early_op(&key, 1) || obj_revive(cfg, &key) ? 0 :
			anomaly_missing(cfg, &key, AN_GET_AFTER_DELETE, AN_UNKNOWN_GET,
					ST_UNKNOWN_GET, &g);
		if (kind)
			anomaly_report(ctx, cfg, kind, &key, 0, &g);
		return 0;
	}
	if (obj_set_aside(cfg, &key))
		return 0;
	__s64 before = __sync_fetch_and_add(&o->count, 1);
	__sync_fetch_and_add(&o->gets, 1);
	site_count_op(&key, o, OP_GET);
	hist_record(ctx, cfg, &key, o, ROLE_GET, before + 1);
	return 0;
}

/* Misuse found by a put or a delete is reported once, at the end (anomaly_report). */
static __always_inline int do_put(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = arg_fetch(ctx, &cfg->obj)};
	return put_object(ctx, cfg, &key);
}

static __always_inline int do_delete(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = arg_fetch(ctx, &cfg->obj)};
	if (key.addr == 0)
		return 0;
	struct grave_val g = {};
	__u32 kind = 0;
	__s64 count = 0;
	struct obj_val *o = obj_lookup(&key);
	if (!o) {
		kind = anomaly_missing(cfg, &key, AN_DOUBLE_DELETE, AN_UNKNOWN_DELETE,
				       ST_UNKNOWN_DELETE, &g);
	} else {
		if ((cfg->flags & PF_DELETE_IN_PUT) && o->count == 1) {
			/* The last put is under way and its own probe fires after this:
			 * count it now, and let that probe pass. */
			__u32 tid = (__u32)bpf_get_current_pid_tgid();
			__sync_fetch_and_add(&o->puts, 1);
			__sync_fetch_and_add(&o->count, -1);
			put_due.update(&key, &tid);
			site_count_op(&key, o, OP_PUT);
		}
		count = o->count;
		if (count != 0) {
			g = obj_describe(o, 0);
			kind = AN_DELETE_LIVE;
		}
		hist_record(ctx, cfg, &key, o, ROLE_DELETE, count);
		obj_release(&key, o);
	}
	if (kind)
		anomaly_report(ctx, cfg, kind, &key, count, &g);
	return 0;
}

/* ref_sink: a floating object's reference becomes its owner's (no change);
 * on an object that is not floating it is a get. */
static __always_inline int do_sink(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u64 addr = arg_fetch(ctx, &cfg->obj), word = 0;
	if (addr && bpf_probe_read_user(&word, sizeof(word), (void *)(addr + cfg->flag_offset)) == 0
	    && (word & cfg->flag_mask)) {
		struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32, .addr = addr};
		if (objs.lookup(&key))
			stat_count(ST_FLOATING_SUNK);
		return 0;
	}
	return do_get(ctx, cfg);
}

/* A function that changes no count (it calls a probed get/put itself) but
 * is where the library's "may be leaked" flag can be read. */
static __always_inline int do_check(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	struct obj_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
			      .addr = arg_fetch(ctx, &cfg->obj)};
	if (key.addr && objs.lookup(&key))
		obj_set_aside(cfg, &key);
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
	if (cfg->cond && !arg_branch_taken(ctx, cfg->cond))
		return 0;
	/* hits of traced processes only: another program on the machine calling the probed
	 * library (tests run in parallel) must not make a role of this run look used */
	__u64 *hits = probe_hits.lookup(&index);
	if (hits && proc_tracked(bpf_get_current_pid_tgid() >> 32))
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
 * cheap look at the object first, so counting stays cheap), all in a traced
 * process only.  A probe in a shared library fires in every process calling it;
 * walking the others' stacks filled the store with stacks nobody reports or frees
 * (issue 54: GLib's `performance` beside other GLib programs). */
static __always_inline int needs_stack(struct pt_regs *ctx, struct probe_cfg *cfg)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (cfg->role == ROLE_INIT) {  /* do_init's own test: no stack for a process not traced */
		struct proc_val *proc = procs.lookup(&tgid);
		return proc && !(proc->flags & PROC_IGNORED);
	}
	if (!proc_tracked(tgid))
		return 0;
	if (KNOB(history))
		return 1;
	if (cfg->role == ROLE_INIT_ENTRY || cfg->role == ROLE_OFF)
		return 0;
	struct obj_key key = {.tgid = tgid, .addr = arg_fetch(ctx, &cfg->obj)};
	struct obj_val *o = objs.lookup(&key);
	if (!o)  /* unknown or released: reported unless seen before */
		return !unknown_seen.lookup(&key);
	if (cfg->role == ROLE_PUT)
		return o->count <= 0;
	return cfg->role == ROLE_DELETE && o->count != 0;
}

/* ---- entry points ------------------------------------------------------- */

/* One program for every entry and return probe: the stack first where the
 * operation records one (unwind.h), then the logic. */
int on_probe(struct pt_regs *ctx)
{
	__u32 index = bpf_get_attach_cookie(ctx);
	struct probe_cfg *cfg = probe_cfgs.lookup(&index);
	set_probe_stack(0);
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (cfg && cfg->role == ROLE_INIT && !KNOB(filtered)) {
		/* a process found system-wide is registered before its first init's stack
		 * is walked: the stack is then keyed, owned and freed with its generation */
		if (!procs.lookup(&tgid))
			proc_register(tgid, EV_PROC, tgid);
	}
	/* Another program's process mapping the probed library (a GLib program beside a
	 * target on libgobject): nothing of it is counted, so no stack and no body.  Its
	 * init stacks were walked and stored before, owned by a process never reported,
	 * so never freed: one GLib test filled a serve's stack store for good (the gst
	 * soak, benchmarks/results/gst-soak.md), and each of its calls ran the body. */
	if (!proc_tracked(tgid))
		return 0;
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

static __always_inline int continue_unwind(struct pt_regs *ctx, struct stack_rec *rec,
					   struct exec_maps *maps, struct unwind_state *st)
{
	__u32 stop = unwind_chunk(rec, maps, st);
	if (!stop && st->next < UNWIND_DEPTH)
		probe_progs.call(ctx, PROG_UNWIND_MORE);  /* returns only if it failed */
	if (!stop)
		stop = TR_DEPTH + 1;
	rec->truncated = stop - 1;
	rec->truncated_at = rec->nr;
	rec->method = st->r.used == 3 ? UW_MIXED : st->r.used == 2 ? UW_CFI : UW_FP;
	if (!rec->nr)  /* the pc is in no mapping we know: the kernel's walk */
		return to_body(ctx, stack_keep(rec, unwind_fp(ctx, rec) == 0));
	return to_body(ctx, stack_keep(rec, 1));
}

/* The stack at the probe: the CFI walk (knob `unwind`), else the kernel's
 * frame-pointer walk. */
int on_unwind(struct pt_regs *ctx)
{
	int zero = 0;
	struct stack_rec *rec = stack_new();
	struct unwind_state *st = unwind_states.lookup(&zero);
	if (!rec || !st)
		return to_body(ctx, 0);
	struct exec_maps *maps = KNOB(unwind) ? exec_maps.lookup(&rec->tgid) : 0;
	if (!maps)  /* no CFI walk, or not seen exec'ing and not seeded */
		return to_body(ctx, stack_keep(rec, unwind_fp(ctx, rec) == 0));
	__builtin_memset(st, 0, sizeof(*st));
	st->r.pc = PT_REGS_IP(ctx);
	st->r.sp = PT_REGS_SP(ctx);
	st->r.bp = PT_REGS_FP(ctx);
	unwind_pending_uretprobes(&st->r);
	return continue_unwind(ctx, rec, maps, st);
}

int on_unwind_more(struct pt_regs *ctx)
{
	int zero = 0;
	struct stack_rec *rec = stack_scratch.lookup(&zero);
	struct unwind_state *st = unwind_states.lookup(&zero);
	struct exec_maps *maps = rec && KNOB(unwind) ? exec_maps.lookup(&rec->tgid) : 0;
	if (!rec || !st || !maps)  /* never without the CFI walk */
		return to_body(ctx, 0);
	return continue_unwind(ctx, rec, maps, st);
}

/* User space read the library's "may be leaked" flag of object args[1] of process
 * args[0] where it reads that process's memory anyway (the exit scan, GET /leaks:
 * the process is stopped), instead of a probe per call reading it: set it aside as
 * that probe would.  Never attached: run by BPF_PROG_TEST_RUN (a raw tracepoint
 * program is the kind that can be).  1: it was live and is set aside. */
int on_set_aside(struct bpf_raw_tracepoint_args *ctx)
{
	struct obj_key key = {.tgid = (__u32)ctx->args[0], .addr = ctx->args[1]};
	if (!objs.lookup(&key))
		return 0;
	obj_put_aside(&key);
	return 1;
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
	__u32 parent = bpf_get_current_pid_tgid() >> 32;
	maps_fork(parent, args->child_pid);
	struct proc_val *pp = procs.lookup(&parent);
	/* an ignored process's child is judged by the filters at its own first init */
	if (!pp || (pp->flags & PROC_IGNORED))
		return 0;
	/* Threads pass here too: their entry is dropped again in sched_process_exit. */
	proc_register(args->child_pid, EV_FORK, parent);
	__u32 child = args->child_pid;
	fork_parent.update(&child, &parent);
	return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_execve)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	fork_parent.delete(&tgid);  /* a new image: nothing inherited any more */
	struct proc_val *p = procs.lookup(&tgid);
	if (p && (p->flags & PROC_IGNORED))
		procs.delete(&tgid);  /* the filters (program, comm) judge the new image again */
	/* system-wide, every exec: the program filter cannot judge the image to come, and
	 * user space keeps the arguments of a process its first init will announce */
	if (KNOB(filtered) && !proc_tracked(tgid))
		return 0;
	struct event *ev = event_new(EV_EXECVE, tgid, (__u32)id, 0);
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
	event_emit(ev);
	return 0;
}

#ifndef REFCNTD_GROUP_DEAD
#define REFCNTD_GROUP_DEAD 1  /* kernel/program.py says: -DREFCNTD_GROUP_DEAD=0 or 1 */
#endif

/* The process's last thread is exiting.  sched_process_exit says so itself where it has
 * group_dead (6.18 has it; Debian's 6.1 and 6.12 do not: bcc's struct for it then has
 * no such member).  There, do_exit has already decremented task->signal->live when the
 * tracepoint fires (group_dead = atomic_dec_and_test(&signal->live)), so 0 means the
 * same; two threads exiting at once may both read 0: the first drops the process from
 * `procs`, the second finds nothing. */
static __always_inline int signal_live_gone(void)
{
	struct refcntd_config *c = knobs();
	if (!c || c->off_task_signal < 0 || c->off_signal_live < 0)
		return 0;
	void *task = (void *)bpf_get_current_task();
	void *signal = 0;
	int live = 1;
	if (bpf_probe_read_kernel(&signal, sizeof(signal), task + c->off_task_signal) != 0 ||
	    !signal)
		return 0;
	if (bpf_probe_read_kernel(&live, sizeof(live), signal + c->off_signal_live) != 0)
		return 0;
	return live == 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32, tid = (__u32)id;
	ctor_depth.delete(&tid);  /* a constructor that never returned must not outlive its thread */
	fork_parent.delete(&tid);
	if (tid != tgid && procs.lookup(&tid)) {
		struct event *gone = event_new(EV_THREAD_GONE, tgid, tid, 0);
		procs.delete(&tid);
		if (gone)
			event_emit(gone);
	}
	if (tid != tgid)
		maps_exit(tid);  /* a thread's copy made at its clone */
#if REFCNTD_GROUP_DEAD
	if (!args->group_dead)
		return 0;
#else
	if (!signal_live_gone())
		return 0;
#endif
	maps_exit(tgid);
	struct proc_val *proc = procs.lookup(&tgid);
	if (!proc)
		return 0;
	struct event *ev = event_new(EV_EXIT, tgid, tid, proc->gen);
	procs.delete(&tgid);
	if (!ev)
		return 0;
	struct refcntd_config *c = knobs();
	void *task = (void *)bpf_get_current_task();  /* read at a BTF offset, no headers */
	int code = 0;
	if (c && c->exit_code_off >= 0 &&
	    bpf_probe_read_kernel(&code, sizeof(code), task + c->exit_code_off) == 0)
		ev->exit_code = code;
	event_emit(ev);
	return 0;
}
