/* The refcount debugging stubs proposed for perf (LKML, December 2015).
 * refcntd's default spec (configs/specs/perf-stubs.yaml) probes these. */
#ifndef REFCNT_H
#define REFCNT_H

typedef struct { int counter; } atomic_t;

void __refcnt__init(atomic_t *refcnt, int n, void *obj, const char *name);
void refcnt__delete(void *obj);
void __refcnt__get(atomic_t *refcnt, void *obj, const char *name);
int __refcnt__put(atomic_t *refcnt, void *obj, const char *name);

#define refcnt__init(obj, member, n) __refcnt__init(&(obj)->member, n, obj, #obj)
#define refcnt__init_as(obj, member, n, name) __refcnt__init(&(obj)->member, n, obj, name)
#define refcnt__exit(obj, member) refcnt__delete(obj)
#define refcnt__get(obj, member) __refcnt__get(&(obj)->member, obj, #obj)
#define refcnt__put(obj, member) __refcnt__put(&(obj)->member, obj, #obj)

#endif
