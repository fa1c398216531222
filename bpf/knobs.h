/* The run-time configuration (struct refcntd_config in refcntd.h).
 *
 * Each option that only picks a branch (a process filter, the spec's delete role,
 * comm and cgroup filters, CFI unwinding, holding, per-site counts, history)
 * used to be a -D of its own: one compiled variant per option set, clang's 2-4 s
 * at the first start of each.  They are now the one entry of `config`, which
 * kernel/program.py writes and then freezes before it loads any program.  The
 * verifier reads a frozen map that programs may only read (BPF_F_RDONLY_PROG)
 * as constants (bpf_map_direct_read in check_mem_access): it follows only the
 * branches this start takes, as it did with the -D variants, and turns the
 * others into jumps.  What is left per knob read is the lookup, an array lookup
 * the kernel inlines, and one load.
 *
 * libbpf-tools set such knobs as `const volatile` globals in .rodata before the
 * load; bcc 0.26 cannot: it makes no map for .rodata and leaves the global's
 * ld_imm64 unrelocated (src 0, imm 0), so the program reads address 0 and the
 * verifier refuses it (see kernel/program.py).
 *
 * Included by refcntd.c first: every other header may read a knob.
 */
#ifndef REFCNTD_KNOBS_H
#define REFCNTD_KNOBS_H

#ifndef BPF_F_RDONLY_PROG
#define BPF_F_RDONLY_PROG (1U << 7)
#endif

BPF_F_TABLE("array", int, struct refcntd_config, config, 1, BPF_F_RDONLY_PROG);

/* The configuration; never NULL at run time (an array has its entry), but the
 * verifier of an older kernel wants it checked. */
static __always_inline struct refcntd_config *knobs(void)
{
	int zero = 0;
	return config.lookup(&zero);
}

/* A flag of the configuration (a __u8 field): KNOB(sites), KNOB(history) ... */
#define KNOB(field) knob_flag(__builtin_offsetof(struct refcntd_config, field))

static __always_inline int knob_flag(__u32 offset)
{
	__u8 *c = (__u8 *)knobs();
	return c && c[offset];
}

#endif
