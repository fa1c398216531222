/* Kernel/user contract of refcntd: the only place the ABI is written.
 *
 * refcntd/kernel/abi.py is generated from this file (python -m
 * refcntd.kernel.abigen; a unit test fails on drift), and at load time every
 * map's key and value is compared field by field with what bcc compiled.
 * Keep to the subset abigen reads: #define constants, enums with one comment
 * per member, structs of __u8..__s64 / char / nested structs / arrays.
 * Every member of enum refcntd_stat needs a comment starting with "loss:"
 * (a record was lost: the run is incomplete) or "note:" (shown, not a
 * loss); the rest of the comment is the text the report and /metrics show. */
#ifndef REFCNTD_H
#define REFCNTD_H

#define TYPE_NAME_LEN 32
#define STACK_DEPTH 48
#define ARGV_SLOTS 8
#define ARGV_LEN 128
#define PATH_LEN 128
#define LINK_MAP_MAX 64  /* ld.so's loaded objects reported per change (ldso.h) */
#define FNV_OFFSET 2166136261  /* FNV-1a 32-bit: type ids (type_intern) */
#define FNV_PRIME 16777619

enum refcntd_role { ROLE_INIT = 0, ROLE_GET = 1, ROLE_PUT = 2, ROLE_DELETE = 3,
		   ROLE_INIT_ENTRY = 4, /* saves a constructor's arguments for its return probe */
		   ROLE_SINK = 5, /* ref_sink: a get unless the object's floating flag is set */
		   ROLE_CHECK = 6, /* changes no count: reads the object's "may be leaked" flag */
		   ROLE_OFF = 7 /* a call site of a function moved back to its entry probe */ };

/* probe_cfg.flags: how a role behaves on this API (see the README's spec reference). */
#define PF_FREES_AT_ZERO 1  /* put: the put to 0 ends life even when the spec has a delete */
#define PF_DELETE_IN_PUT 2  /* delete: fires inside the last put, before that put's probe */
#define PF_OBJ_OUT 4        /* init return probe: the object is *(pointer saved at entry) */
#define PF_STATIC_IF 8      /* not an operation on objects whose int at static_offset is static_value */
#define PF_QUIET_UNKNOWN 16 /* never-seen objects are counted, not reported one by one */
#define PF_MAY_LEAK_FLAG 32 /* the library's "may be leaked" bit: at kept_offset under kept_mask */
#define PF_REVIVE 64        /* get: revives the object this thread's last put released (dispose kept it) */
#define PF_MAY_EXIST 128    /* init: a live object returned is that object (no new one): may_return_existing */
#define PF_EXISTING_GET 256 /* PF_MAY_EXIST: ... and the constructor's return is a get on it */
#define PF_REUSES_ARG 512   /* PF_MAY_EXIST: only the object at *obj saved at entry; another return drops it */
#define PF_ABSORBS_PUT 1024 /* put: this thread's next put on the object, made inside this one, is part of it */

/* What the kernel side could not record: shown in every report header. */
enum refcntd_stat {
	ST_OBJ_MAP_FULL = 0,    /* loss: inits not recorded: object map full */
	ST_STACK_LOST,          /* loss: stacks not recorded: stack store full */
	ST_STACK_COLLISION,     /* loss: stacks not recorded: two different stacks had the same 64-bit hash */
	ST_UNKNOWN_GET,         /* note: gets on objects never seen initialised (created before tracing began, or by a function the spec does not name) */
	ST_UNKNOWN_PUT,         /* note: puts on objects never seen initialised */
	ST_UNKNOWN_DELETE,      /* note: deletes of objects never seen initialised */
	ST_REINIT_LIVE,         /* loss: objects re-initialised at a live address (earlier record replaced) */
	ST_STALE_REPLACED,      /* loss: records of an exited process replaced before they were drained */
	ST_EVENT_LOST,          /* loss: lifecycle events lost: ring buffer full */
	ST_PROC_MAP_FULL,       /* loss: processes not traced: process table full */
	ST_CALLER_UNREAD,       /* loss: callers of init not read */
	ST_PUT_BELOW_ZERO,      /* note: puts on a count already at or below zero (see the anomalies) */
	ST_TYPE_MAP_FULL,       /* loss: type names not recorded: type table full */
	ST_STACK_UNREAD,        /* loss: stacks not recorded: the user stack could not be read */
	ST_INIT_ARGS_LOST,      /* loss: constructors returned without the arguments saved at entry */
	ST_HISTORY_MAP_FULL,    /* loss: objects without a get/put history: history map full */
	ST_SITES_MAP_FULL,      /* loss: released objects' get/put paths not recorded: site map full (culprits may miss a baseline) */
	ST_FLOATING_SUNK,       /* note: floating references sunk (ref_sink on a floating object: no count change) */
	ST_STATIC_SKIPPED,      /* note: operations on the library's static objects, not counted (spec: static_if) */
	ST_MAY_BE_LEAKED,       /* note: objects the library flags "may be leaked", set aside (spec: may_be_leaked) */
	ST_REVIVED,             /* note: objects kept alive by their dispose after their last put (spec: revives) */
	ST_TRUNC_NO_TABLE,      /* note: stacks cut at a module with neither frame pointers nor an unwind table */
	ST_TRUNC_UNREADABLE,    /* note: stacks cut where the user stack could not be read */
	ST_TRUNC_DEPTH,         /* note: stacks cut at the depth limit */
	ST_TRUNC_OUTSIDE,       /* note: stacks cut at a return address outside every executable mapping */
	ST_TRUNC_BAD_RULE,      /* note: stacks cut at an unwind rule the BPF unwinder does not follow */
	ST_EXEC_MAPS_FULL,      /* note: executable mappings not remembered (more than MAX_EXEC_MAPS in a process): frames there stay unplaced */
	ST_PROC_STATS_FULL,     /* loss: counts not kept per process: per-process table full (process reports may miss their own counts; the totals are exact) */
	ST_PATHS_MAP_FULL,      /* loss: get/put operations of objects with history not counted per path: path map full (their culprits are reported unknown) */
	ST_PATHS_STALE,         /* note: per-path counts of released objects with more than 8 paths kept until their process is reported */
	ST_ALLOC_SITES_FULL,    /* note: objects not counted per allocation site: site table full (live counts, metrics and diffs leave them out) */
	ST_AGE_BINS_FULL,       /* note: objects not counted by creation time: age table full (the age metrics leave them out) */
	ST_EXISTING_RETURNED,   /* note: constructors that returned an object already live: no new object (spec: may_return_existing) */
	ST_REUSE_DROPPED,       /* note: objects a constructor was given to reuse and dropped (it failed: a put; spec: may_return_existing) */
	ST_COUNT
};

enum refcntd_event { EV_PROC = 1, EV_FORK = 2, EV_EXECVE = 3, EV_EXIT = 4, EV_THREAD_GONE = 5,
		     EV_LIBRARY = 6, EV_ANOMALY = 7,
		     EV_HOLD = 8 /* a process stopped until user space scanned a new module */ };

/* Misuse caught at the offending operation. */
enum refcntd_anomaly {
	AN_DOUBLE_PUT = 1,        /* put on a live object whose count was already 0 */
	AN_NEGATIVE_COUNT = 2,    /* put on a live object whose count was already below 0 */
	AN_PUT_AFTER_DELETE = 3,  /* put on a deleted / released object */
	AN_GET_AFTER_DELETE = 4,  /* get on a deleted / released object (use after put) */
	AN_DELETE_LIVE = 5,       /* delete while the count is not 0 */
	AN_DOUBLE_DELETE = 6,     /* delete of an already deleted object */
	AN_UNKNOWN_GET = 7,       /* get on an object never seen initialised */
	AN_UNKNOWN_PUT = 8,
	AN_UNKNOWN_DELETE = 9,
};

enum refcntd_loc { LOC_NONE = 0, LOC_REG = 1, LOC_MEM = 2, LOC_IMM = 3 };

/* Where a value is at the probe: a saved register, memory at register +
 * displacement, or a constant.  Function arguments are registers; USDT
 * arguments are whatever their SDT argument spec says. */
struct arg_loc {
	__u8 kind;        /* enum refcntd_loc; LOC_NONE: use the fixed value */
	__u8 size;        /* 1, 2, 4 or 8 */
	__u8 is_signed;
	__u8 pad;
	__u16 reg_off;    /* offset of the register in struct pt_regs */
	__u16 pad2;
	__u32 pad3;
	__s64 value;      /* displacement (LOC_MEM) or the constant (LOC_IMM) */
};

struct probe_cfg {
	__u32 role;
	__s32 caller_sp;   /* >= 0: return address at [rsp + caller_sp]; -1: in the walked stack */
	__s32 fixed_count;
	__u32 fixed_type;
	__u32 is_return;   /* a return probe: the object is the return value */
	__u32 cond;        /* a conditional tail jump to the function: 0x10 | x86 condition code */
	__u32 flags;       /* PF_* */
	struct arg_loc obj;
	struct arg_loc type;   /* a const char * */
	struct arg_loc count;
	__u32 type_deref[2];   /* N > 0: the type name is the pointer at (value + N - 1), in turn */
	__u32 flag_offset;     /* sink: the floating flag is at object + flag_offset */
	__u32 flag_mask;       /* sink: ... under this mask (0: no sink) */
	__u32 static_offset;   /* PF_STATIC_IF: a library's static objects (count -1 ...) */
	__s32 static_value;
	__u32 kept_offset;     /* PF_MAY_LEAK_FLAG: objects the library expects to outlive it */
	__u32 kept_mask;
};

/* hist_val.e as compiled: the most entries an object with history keeps.  A start
 * keeps refcntd_config.history_depth of them (--history-depth, a power of two up
 * to this): kernel/program.py cuts the history maps' values to that size. */
#ifndef HISTORY_DEPTH
#define HISTORY_DEPTH 256
#endif
#define HISTORY_SITES 8

/* One get/put/init/delete of an object with history (--history). */
struct hist_entry {
	__u32 op;            /* enum refcntd_role */
	__s32 count_after;
	__u32 pad;
	__u64 stack_id;      /* key in stack_store, 0: none */
	__u64 caller_ip;
	__u64 ts;
};

/* A path an object with history created in hist_paths: the first
 * HISTORY_SITES of them, so its release can delete them. */
struct hist_path {
	__u32 op;
	__u32 pad;
	__u64 stack_id;
	__u64 caller_ip;
};

struct hist_val {
	__u64 n;             /* operations seen; entries beyond HISTORY_DEPTH were dropped */
	__u64 serial;        /* the object's init time: tells its paths from a predecessor's */
	__u64 npaths;        /* distinct paths it created in hist_paths */
	__u64 paths_lost;    /* operations whose path could not be counted (hist_paths full) */
	struct hist_path path[HISTORY_SITES];
	struct hist_entry e[HISTORY_DEPTH];
};

/* Exact count of one object's operations at one path (--history): aggregated
 * in the kernel, so hundreds of distinct get/put paths stay exact. */
struct path_key {
	__u32 tgid;
	__u32 op;
	__u64 addr;
	__u64 serial;
	__u64 stack_id;
	__u64 caller_ip;
};

struct path_val {
	__u64 count;
	__u64 first_ns;
	__u64 last_ns;
};

/* Stacks a process created, so all of them (released objects' too) are
 * freed when the process is reported: the kernel never frees stack ids. */
struct proc_stack {
	__u32 tgid;
	__u32 pad;
	__u64 stack_id;
};

/* Per process and type, every operation of objects with history at each path;
 * minus the leaked objects' own paths this is the released objects' baseline.
 * A type named by a pointer the kernel could not read (type_id 0) is told apart
 * by that pointer: objects of the stub API would otherwise share one baseline. */
struct site_key {
	__u32 tgid;
	__u32 type_id;
	__u32 op;
	__u32 pad;
	__u64 stack_id;
	__u64 caller_ip;
	__u64 name_ptr;       /* type_id 0: the type name's address in the process */
};

/* A constructor's arguments, saved at its entry for the return probe. */
struct init_args {
	__u64 type_ptr;
	__s64 count;
	__u64 out_ptr;   /* PF_OBJ_OUT, PF_REUSES_ARG: where the constructor stores the object */
	__u64 existing;  /* PF_REUSES_ARG: the object it was given to reuse (0: none) */
};

/* A counter of one process (key of proc_stats): each process's report shows its own
 * losses and notes, not those of every process the tracer ever saw. */
struct proc_stat_key {
	__u32 tgid;
	__u32 stat;
};

struct obj_key {
	__u32 tgid;
	__u32 pad;
	__u64 addr;
};

/* 64 bytes: with the 16-byte key and the kernel's 48-byte hash element header
 * an entry is 128 bytes, the allocator's size class for 120 bytes anyway. */
struct obj_val {
	__s64 count;          /* 64-bit: LLVM 14 only has fetch-and-add for 64-bit words */
	__u32 gets;
	__u32 puts;
	__u32 gen;
	__u32 type_id;        /* 0: the name could not be read here, see name_ptr */
	__u64 stack_id;       /* key in stack_store (0: none): symbolizable after the process exits */
	__u64 init_ns;
	__u64 caller_ip;      /* raw return address into the init's caller, 0 if in the stack */
	__u64 name_ptr;       /* type-name pointer when the page was not present at init */
	__u64 since_cp;       /* sites.h: the checkpoint whose since-count holds it (0: none) */
};

/* A released object, remembered (LRU) to tell use-after-delete from an
 * object that was never seen. */
struct grave_val {
	__u32 type_id;
	__u32 gen;
	__u64 stack_id;
	__u64 caller_ip;
	__u64 name_ptr;
	__u64 init_ns;
	__u64 released_ns;
};

/* One anomaly, with the stacks of the offending operation and of the
 * object's allocation.  Travels in the same ring buffer as `struct event`;
 * both begin with `kind`. */
struct anomaly {
	__u32 kind;           /* EV_ANOMALY */
	__u32 tgid;
	__u32 tid;
	__u32 anomaly;        /* enum refcntd_anomaly */
	__u64 ts;
	__u64 addr;
	__s64 count_before;
	__u32 type_id;
	__u32 gen;
	__u64 stack_id;       /* the offending operation */
	__u64 caller_ip;
	__u64 alloc_stack_id; /* the object's init, 0 when never seen or not recorded */
	__u64 alloc_caller_ip;
	__u64 name_ptr;
	__u64 init_ns;
	__u64 released_ns;    /* 0 unless the object had been released */
};

/* sites.h (serve, attach): live objects counted where they were created, per process,
 * so that a scrape or a diff reads O(allocation sites), never every object. */
struct alloc_site {
	__u32 tgid;
	__u32 gen;
	__u32 type_id;
	__u32 pad;
	__u64 name_ptr;       /* type_id 0: the name's address in the process */
	__u64 stack_id;
	__u64 caller_ip;
};

struct alloc_count {
	__s64 live;           /* created here and not released */
	__u64 created;        /* ever */
	__u64 gets;           /* type_id 0 only (not in the per-type totals): operations on */
	__u64 puts;           /* the objects created here, for user space to name */
	__u64 released;
};

/* Objects created at a site since a checkpoint (CLOCK_MONOTONIC ns) and live. */
struct since_key {
	struct alloc_site site;
	__u64 cp;
};

struct since_count {
	__s64 live;
	__s64 age_sum;        /* sum of (init_ns - cp) >> 10 of those objects: their mean age */
};

/* Live objects of a type by creation time: fine bins (init_ns >> AGE_FINE_SHIFT) for
 * recent objects, coarse ones (AGE_COARSE | init_ns >> AGE_COARSE_SHIFT) for all. */
#define AGE_FINE_SHIFT 30      /* 1.07 s */
#define AGE_COARSE_SHIFT 37    /* 137 s */
#define AGE_COARSE 2147483648U  /* bit 31 of age_key.bin */
#define AGE_FINE_HORIZON_S 600  /* no fine bin is counted for an object older than this */
struct age_key {
	__u32 tgid;
	__u32 gen;
	__u32 type_id;
	__u32 bin;
	__u64 name_ptr;
};

/* How a stack was obtained (see bpf/stackstore.h). */
enum refcntd_unwind { UW_NONE = 0, UW_FP = 1 /* frame pointers */, UW_CFI = 2 /* CFI unwind tables */,
		      UW_MIXED = 3 /* frame pointers and CFI */ };

/* Why a walk ended before the outermost frame; TR_NONE: it reached the end. */
enum refcntd_trunc {
	TR_NONE = 0,
	TR_NO_TABLE = 1,    /* the module has neither frame pointers nor an unwind table */
	TR_UNREADABLE = 2,  /* the user stack could not be read there */
	TR_DEPTH = 3,       /* depth limit */
	TR_OUTSIDE = 4,     /* the next return address is outside every executable mapping */
	TR_BAD_RULE = 5,    /* the unwind rule there is not one the BPF unwinder follows */
};

/* One recorded stack, the value of the content-addressed stack_store: its key
 * is a 64-bit hash of (tgid, gen, frames), so two different stacks never share
 * an entry; a hash collision is detected on insert and counted. */
struct stack_rec {
	__u32 tgid;
	__u32 gen;            /* of the process: a reused pid never shares a stack */
	__u32 nr;             /* frames in ip[] and frame[] */
	__u16 method;         /* enum refcntd_unwind */
	__u16 truncated;      /* enum refcntd_trunc */
	__u32 truncated_at;   /* frame index where the walk stopped (nr when it did not) */
	__u32 pad;
	__u64 ip[STACK_DEPTH];
	struct bpf_stack_build_id frame[STACK_DEPTH];  /* build-id + file offset, or ip */
};

/* CFI unwinding (bpf/unwind.h; tables compiled by refcntd/binary/cfi.py). */
#define MAX_EXEC_MAPS 32       /* executable file mappings remembered per process */
#define CFI_SEARCH_STEPS 24    /* binary-search steps: up to 16M rows per module */
#define MOD_FP 1               /* cfi_module.flags: the module keeps frame pointers */
#define EXE_PGOFF 0xffffffff   /* exec_map.pgoff of the executable: use the module's text_off */
#define FRAME_FILE 3           /* stack_rec.frame[].status: no build-id known; build_id holds the
				  file's inode (8 bytes) and dev (4), offset its file offset */
#define FRAME_EXE_TEXT 4       /* the same for the program exec() mapped: offset is from the
				  start of its executable segment (mm->start_code) */

/* How a row computes the caller's frame (the CFA) at a pc. */
enum refcntd_cfa { CFA_NONE = 0 /* no FDE covers the pc */, CFA_RSP = 1, CFA_RBP = 2,
		   CFA_PLT = 3 /* the x86-64 PLT expression */,
		   CFA_BAD = 4 /* a rule the BPF unwinder does not follow */,
		   CFA_END = 5 /* return address undefined: the outermost frame */ };

/* One row of a module's unwind table, sorted by pc (a file offset): from
 * this pc on, CFA = (rsp or rbp) + cfa_off, the return address is at CFA-8
 * and rbp was saved at CFA + rbp_off (0: rbp unchanged). */
struct cfi_row {
	__u32 pc;
	__s32 cfa_off;
	__s16 rbp_off;
	__u8 cfa;             /* enum refcntd_cfa */
	__u8 pad;
};

struct file_key {
	__u64 ino;
	__u32 dev;            /* the kernel's dev_t: major << 20 | minor */
	__u32 pad;
};

/* hold.h: a place in a module (a function, by file offset; 0: the module itself). */
struct hold_key {
	struct file_key file;
	__u64 offset;
};

/* A module's table: rows [first, first + count) of cfi_rows. */
struct cfi_module {
	__u32 first;
	__u32 count;
	__u32 flags;          /* MOD_FP */
	__u32 text_off;       /* file offset of the executable segment (p_offset) */
	__u8 build_id[20];
	__u32 pad;
};

/* One executable file mapping of a process: file offset = pc - start + pgoff. */
struct exec_map {
	__u64 start;
	__u64 end;
	__u64 pgoff;          /* EXE_PGOFF: the executable mapped by exec() */
	struct file_key file;
};

struct exec_maps {
	__u32 n;
	__u32 pad;
	struct exec_map m[MAX_EXEC_MAPS];
};

/* An mmap(PROT_EXEC) of a file, between its syscall's entry and exit. */
struct mmap_args {
	__u64 len;
	__u64 off;
	__s32 fd;
	__u32 pad;
};

/* The run-time configuration: the one entry of the `config` array (bpf/knobs.h),
 * written by refcntd/kernel/program.py before any program is loaded, then frozen. */
struct refcntd_config {
	__u8 filtered;          /* only processes in `procs` (run / --pid); 0: system-wide */
	__u8 has_delete;        /* the spec has a delete role: a put to zero does not end life */
	__u8 filter_comm;       /* system-wide: only processes whose comm is in comm_allow */
	__u8 unwind;            /* CFI unwinding with tables from user space (unwind.h); off_* set */
	__u8 hold;              /* stop processes that map unscanned modules (hold.h); needs unwind */
	__u8 sites;             /* count live objects per allocation site and age (sites.h) */
	__u8 history;           /* keep get/put history (history.h) of the types in history_types */
	__u8 history_all;       /* ... of every type */
	__u32 history_depth;    /* entries kept per object: a power of two <= HISTORY_DEPTH */
	__s32 exit_code_off;    /* offset of exit_code in task_struct (BTF); -1: unknown */
	__u64 cgroup_id;        /* system-wide: only processes in this cgroup v2; 0: any */
	__u32 off_task_mm;      /* unwind: offsets of these members in the kernel's structs (BTF) */
	__u32 off_task_files;
	__u32 off_mm_start_code;
	__u32 off_mm_end_code;
	__u32 off_mm_exe_file;
	__u32 off_files_fdt;
	__u32 off_fdt_fd;
	__u32 off_file_inode;
	__u32 off_inode_ino;
	__u32 off_inode_sb;
	__u32 off_sb_dev;
	__u8 hold_tables;       /* also stop a process mapping a probed module while one of its
				 * modules has no unwind table yet (hold.h); needs hold */
	__u8 hold_execs;        /* also stop a traced process that execs a file nobody scanned
				 * (run: programs with their own copy of the functions); needs hold */
	__u8 absorbs_put;       /* a put role absorbs its inner put (PF_ABSORBS_PUT): every put
				 * first looks for one due (objects.h); 0: only after a delete */
	__u8 filter_exe;        /* system-wide: only processes whose executable (mm->exe_file) is
				 * in exe_allow (procs.h: serve's target path); needs unwind's off_* */
	__u32 off_task_utask;   /* pending uretprobes (unwind.h), all 0 when BTF lacks them */
	__u32 off_utask_ri;
	__u32 off_ri_stack;
	__u32 off_ri_orig_ret;
	__u32 off_ri_next;
	__u32 off_mm_uprobes;
	__u32 off_uprobes_xol;
	__u32 off_xol_vaddr;
	__s32 off_task_signal;  /* task_struct.signal and signal_struct.live (BTF), read at an */
	__s32 off_signal_live;  /* exit where the tracepoint has no group_dead; -1: unknown */
};

#define PROC_IGNORED 1  /* filtered out (comm / cgroup): its operations are skipped */
#define PROC_HAS_OBJECTS 2  /* has had a tracked object: the only processes held at _exit */

struct comm_key {
	char comm[16];
};

struct proc_val {
	__u32 gen;
	__u32 flags;
	__u64 start_ns;
};

struct type_name {
	char name[TYPE_NAME_LEN];
};

struct type_totals {
	__u64 inits;
	__u64 gets;
	__u64 puts;
	__u64 released;
};

struct event {
	__u32 kind;
	__u32 tgid;
	__u32 pid;        /* thread id, or child pid for EV_FORK */
	__u32 gen;
	__u64 ts;
	__s32 exit_code;  /* EV_EXIT: task->exit_code when its offset is known, else -1 */
	__u32 argc;
	char comm[16];
	char path[PATH_LEN];
	char argv[ARGV_SLOTS][ARGV_LEN];
};

#endif
