/* ld.so's list of loaded objects, reported as it changes (on_ldso).
 *
 * ld.so calls _dl_debug_state() after every change to its list of loaded
 * objects.  Reporting each object's path then, in order with the exit event,
 * lets user space symbolize frames of libraries dlclose'd before exit.  on_ldso
 * is attached at ld.so's calls to _dl_debug_state; the bpf cookie of each is
 * _r_debug's address minus that call's.
 */
#ifndef REFCNTD_LDSO_H
#define REFCNTD_LDSO_H

/* struct r_debug (<link.h>) on x86-64, and the head of each struct link_map */
#define R_DEBUG_MAP 8          /* r_map: the first link_map */
#define R_DEBUG_STATE 24       /* r_state */
#define RT_CONSISTENT 0        /* the list is not being changed */

struct link_map_head {
	__u64 l_addr;
	__u64 l_name;
	__u64 l_ld;
	__u64 l_next;
};

int on_ldso(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!procs.lookup(&tgid))  /* libraries loaded before tracing starts are on disk */
		return 0;
	__u64 rdebug = PT_REGS_IP(ctx) + (__s64)bpf_get_attach_cookie(ctx);
	int state = 0;
	__u64 map = 0;
	bpf_probe_read_user(&state, sizeof(state), (void *)(rdebug + R_DEBUG_STATE));
	if (state != RT_CONSISTENT)
		return 0;
	bpf_probe_read_user(&map, sizeof(map), (void *)(rdebug + R_DEBUG_MAP));
	for (int i = 0; i < LINK_MAP_MAX && map; i++) {
		struct link_map_head lm = {};
		if (bpf_probe_read_user(&lm, sizeof(lm), (void *)map) != 0)
			break;
		struct event *ev = event_new(EV_LIBRARY, tgid, (__u32)id, 0);
		if (!ev)
			break;
		if (lm.l_name && bpf_probe_read_user_str(ev->path, sizeof(ev->path),
							 (void *)lm.l_name) > 1)
			event_emit(ev);
		map = lm.l_next;
	}
	return 0;
}

#endif
