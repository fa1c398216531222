/* Type names and per-type totals.  A type is named by its FNV-1a hash (its id,
 * never 0), so user space reads each name once from `types`.
 */
#ifndef REFCNTD_TYPES_H
#define REFCNTD_TYPES_H

BPF_HASH(types, __u32, struct type_name, MAX_TYPES);
BPF_PERCPU_HASH(totals, __u32, struct type_totals, MAX_TYPES);
BPF_PERCPU_ARRAY(name_buf, struct type_name, 1);

/* The id of the type named at name_ptr; 0 when the string's page is not present
 * yet (a .rodata literal nobody has touched): user space then reads the name
 * from the file via name_ptr. */
static __always_inline __u32 type_intern(__u64 name_ptr)
{
	int zero = 0;
	struct type_name *buf = name_buf.lookup(&zero);
	if (!buf)
		return 0;
	__builtin_memset(buf->name, 0, TYPE_NAME_LEN);
	if (bpf_probe_read_user_str(buf->name, TYPE_NAME_LEN, (void *)name_ptr) <= 0)
		return 0;
	__u32 hash = FNV_OFFSET;
#pragma unroll
	for (int i = 0; i < TYPE_NAME_LEN; i++) {
		if (buf->name[i] == 0)
			break;
		hash = (hash ^ (__u8)buf->name[i]) * FNV_PRIME;
	}
	hash |= 1;  /* 0 means "not read" */
	if (types.lookup(&hash) == 0 && types.update(&hash, buf) != 0)
		stat_count(ST_TYPE_MAP_FULL);
	return hash;
}

/* Per-CPU operation totals of a type (no atomics needed). */
static __always_inline struct type_totals *type_totals_of(__u32 type_id)
{
	struct type_totals zero = {};
	return totals.lookup_or_try_init(&type_id, &zero);
}

#endif
