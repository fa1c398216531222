/* The stub set, as in the perf patch: noinline, so each call is a probe site.
 * Built at -O2 the get/put stubs begin with a lock-prefixed instruction,
 * where x86 uprobes cannot go; refcntd probes a later instruction. */
#include "refcnt.h"

#define STUB __attribute__((noinline))

STUB void __refcnt__init(atomic_t *refcnt, int n, void *obj, const char *name)
{
	(void)obj; (void)name;
	__atomic_store_n(&refcnt->counter, n, __ATOMIC_SEQ_CST);
}

STUB void refcnt__delete(void *obj)
{
	(void)obj;
	__asm__ volatile("" ::: "memory");
}

STUB void __refcnt__get(atomic_t *refcnt, void *obj, const char *name)
{
	(void)obj; (void)name;
	__atomic_add_fetch(&refcnt->counter, 1, __ATOMIC_SEQ_CST);
}

STUB int __refcnt__put(atomic_t *refcnt, void *obj, const char *name)
{
	(void)obj; (void)name;
	return __atomic_sub_fetch(&refcnt->counter, 1, __ATOMIC_SEQ_CST) == 0;
}
