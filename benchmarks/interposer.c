/* LD_PRELOAD interposer, for the benchmark only: the same bookkeeping
 * refcntd does in the kernel (a hash of object -> count), done in user space
 * in front of librefcnt.so's stubs.  Possible only when the stubs are called
 * through the PLT and the process is started with it. */
#include <stdint.h>
#include "refcnt.h"

#define SLOTS (1 << 16)
static struct { uintptr_t key; long count; } table[SLOTS];

static long *slot(void *obj)
{
	uintptr_t k = (uintptr_t)obj, h = (k >> 4) * 0x9E3779B97F4A7C15ull;
	for (unsigned i = h >> 48;; i = (i + 1) & (SLOTS - 1)) {
		uintptr_t cur = __atomic_load_n(&table[i].key, __ATOMIC_ACQUIRE);
		if (cur == k)
			return &table[i].count;
		if (cur == 0 && __atomic_compare_exchange_n(&table[i].key, &cur, k, 0,
							    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return &table[i].count;
		if (cur == k)
			return &table[i].count;
	}
}

void __refcnt__init(atomic_t *r, int n, void *obj, const char *name)
{
	(void)name;
	__atomic_store_n(&r->counter, n, __ATOMIC_SEQ_CST);
	__atomic_store_n(slot(obj), n, __ATOMIC_RELAXED);
}

void __refcnt__get(atomic_t *r, void *obj, const char *name)
{
	(void)name;
	__atomic_add_fetch(&r->counter, 1, __ATOMIC_SEQ_CST);
	__atomic_add_fetch(slot(obj), 1, __ATOMIC_RELAXED);
}

int __refcnt__put(atomic_t *r, void *obj, const char *name)
{
	(void)name;
	__atomic_sub_fetch(slot(obj), 1, __ATOMIC_RELAXED);
	return __atomic_sub_fetch(&r->counter, 1, __ATOMIC_SEQ_CST) == 0;
}

void refcnt__delete(void *obj) { (void)obj; }
