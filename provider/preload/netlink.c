/* softhca's preload library, part two: the kernel's RDMA netlink (NETLINK_RDMA) as a
 * kernel with softhca's devices registered would answer it, for the processes
 * `softhca run` starts. iproute2's `rdma` (dev, link, system), libibverbs' device list
 * and anything else that asks RDMA netlink see the devices of the sysfs tree
 * SYSFS_PATH names (written by `softhca run`, tools/native.py): one description of the
 * devices, read at each request.
 *
 * How: socket(AF_NETLINK, SOCK_RAW or SOCK_DGRAM, NETLINK_RDMA), when SYSFS_PATH names
 * a tree with class/infiniband_verbs, is an AF_UNIX datagram socket connected to
 * itself (autobound, so no other socket may send to it: the kernel refuses a sender
 * that is not its peer). A request sent on it (send, sendto, sendmsg, write) is
 * answered there and then, in the caller's thread: each answer is a datagram the
 * socket sends itself, which the program's recv/recvmsg/recvfrom/read/poll find in
 * its receive queue as a netlink socket's. recvmsg and recvfrom give the kernel's
 * address (AF_NETLINK, port 0); bind and getsockname the netlink port id. Every other
 * socket, and every call on any other fd, goes to libc untouched.
 *
 * Bounds: at most NL_MAX_SOCKS such sockets per process at once (ENOBUFS past it); a
 * request of at most the socket's send buffer less 32 bytes (EMSGSIZE, as the kernel);
 * answers queue in the socket's receive buffer and one that does not fit is dropped,
 * the next receive then failing ENOBUFS (the kernel's overrun). No thread, no state
 * but the table below. Not emulated: sendmmsg/recvmmsg and a dup'ed copy of such an
 * fd (a dup is a plain AF_UNIX socket). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <pthread.h>
#include <rdma/rdma_netlink.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <limits.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define NL_MAX_SOCKS 32
/* Devices and ports looked at, at most (uverbs0.., ports/1..). */
#define NL_MAX_DEVS 64
#define NL_MAX_PORTS 16
/* One answer: a device's or port's attributes are a few hundred bytes. */
#define NL_MSG_MAX 1024
/* A request gathered from several iovecs lives here, or in a malloc of its size. */
#define NL_GATHER 4096

struct nlsock {
	int fd;			/* -1: free */
	dev_t dev;		/* the AF_UNIX socket's, to tell a reused fd number */
	ino_t ino;
	int type;		/* SOCK_RAW or SOCK_DGRAM, as asked */
	uint32_t portid;	/* 0 until bound */
	uint32_t groups;
	int pending;		/* an error for the next receive (ENOBUFS) */
	bool cap_ack, ext_ack, no_enobufs, strict;
};

static struct nlsock socks[NL_MAX_SOCKS] = {
	[0 ... NL_MAX_SOCKS - 1] = { .fd = -1 },
};
static int nsocks;		/* entries in use; 0 keeps every call on the fast path */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t next_portid;	/* the next port id autobind tries after the pid */

/* libc's own functions, found once at load (before any thread of the program); a call
 * that comes before (another library's constructor) takes the system call itself. */
static int (*real_socket)(int, int, int);
static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);
static int (*real_getpeername)(int, struct sockaddr *, socklen_t *);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_getsockopt)(int, int, int, void *, socklen_t *);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *,
			      socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_recv)(int, void *, size_t, int);
static ssize_t (*real_recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
static ssize_t (*real_recvmsg)(int, struct msghdr *, int);

/* fork(2) while another thread holds the table's lock: the child gets it free. */
static void nl_prefork(void) { pthread_mutex_lock(&lock); }
static void nl_postfork(void) { pthread_mutex_unlock(&lock); }

__attribute__((constructor)) static void nl_init(void)
{
	pthread_atfork(nl_prefork, nl_postfork, nl_postfork);
#define R(name) real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name)
	R(socket); R(bind); R(connect); R(getsockname); R(getpeername); R(setsockopt);
	R(getsockopt); R(send); R(sendto); R(sendmsg); R(write); R(recv); R(recvfrom);
	R(recvmsg);
#undef R
}

/* -- the table ------------------------------------------------------------------- */

static void forget(int i)
{
	socks[i].fd = -1;
	__atomic_sub_fetch(&nsocks, 1, __ATOMIC_RELEASE);
}

/* A copy of fd's entry if fd is one of ours (its number and its socket: a number the
 * program closed and reused is not, and its stale entry goes, so that calls on the new
 * file take the fast path again); false otherwise. */
static bool lookup(int fd, struct nlsock *out)
{
	struct stat st;
	bool ours;
	int i;

	if (fd < 0 || !__atomic_load_n(&nsocks, __ATOMIC_ACQUIRE))
		return false;
	for (i = 0; i < NL_MAX_SOCKS; i++)
		if (__atomic_load_n(&socks[i].fd, __ATOMIC_RELAXED) == fd)
			break;
	if (i == NL_MAX_SOCKS)
		return false;
	pthread_mutex_lock(&lock);
	*out = socks[i];
	ours = out->fd == fd && fstat(fd, &st) == 0 && out->dev == st.st_dev &&
	       out->ino == st.st_ino;
	if (!ours && socks[i].fd == fd)
		forget(i);
	pthread_mutex_unlock(&lock);
	return ours;
}

/* Entries whose fd is closed or now another file (the program closed ours). Lock held. */
static void sweep(void)
{
	struct stat st;

	for (int i = 0; i < NL_MAX_SOCKS; i++)
		if (socks[i].fd >= 0 && (fstat(socks[i].fd, &st) || st.st_dev != socks[i].dev ||
					 st.st_ino != socks[i].ino))
			forget(i);
}

static struct nlsock *entry_of(int fd)	/* lock held */
{
	for (int i = 0; i < NL_MAX_SOCKS; i++)
		if (socks[i].fd == fd)
			return &socks[i];
	return NULL;
}

/* The kernel's autobind: the process id first, then numbers of its own choosing
 * (negative as int, as the kernel's), never one of our sockets' in this process.
 * Lock held. */
static uint32_t autobind_portid(void)
{
	uint32_t id = (uint32_t)getpid();

	for (;;) {
		bool used = false;

		for (int i = 0; i < NL_MAX_SOCKS; i++)
			if (socks[i].fd >= 0 && socks[i].portid == id)
				used = true;
		if (!used && id)
			return id;
		id = 0xfffff000u - next_portid++;
	}
}

static void set_portid(int fd)	/* autobind fd's entry if unbound */
{
	struct nlsock *e;

	pthread_mutex_lock(&lock);
	e = entry_of(fd);
	if (e && !e->portid)
		e->portid = autobind_portid();
	pthread_mutex_unlock(&lock);
}

/* Is the tree SYSFS_PATH names one to answer for? (libibverbs' rule for the variable:
 * not for set-user-ID programs.) */
static const char *sysfs_root(void)
{
	const char *root = secure_getenv("SYSFS_PATH");
	char path[4096];

	if (!root || !*root)
		return NULL;
	if (snprintf(path, sizeof(path), "%s/class/infiniband_verbs", root) >= (int)sizeof(path))
		return NULL;
	return access(path, F_OK) == 0 ? root : NULL;
}

/* -- the devices, from the sysfs tree --------------------------------------------- */

/* The first line of <root>/<rel> (its newline cut) into buf; its length or -1. */
static int read_line(const char *root, const char *rel, char *buf, size_t size)
{
	char path[4096];
	ssize_t n;
	int fd;

	if (snprintf(path, sizeof(path), "%s/%s", root, rel) >= (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	return (int)strlen(buf);
}

struct nldev {
	uint32_t index;
	char name[64];
	char chardev[32];	/* uverbsN */
	uint64_t cdev;		/* the kernel's huge_encode_dev of uverbsN/dev */
	uint64_t abi;
	uint8_t node_type;
	uint64_t node_guid, sys_image_guid, cap_flags;
	char fw[128];
	uint32_t ports;
	bool ib;		/* port 1's link layer InfiniBand (else RoCE) */
};

static uint64_t guid_of(const char *s)	/* sysfs' xxxx:xxxx:xxxx:xxxx */
{
	uint64_t v = 0;

	for (; *s; s++) {
		if (*s == ':')
			continue;
		if (*s >= '0' && *s <= '9')
			v = v << 4 | (uint64_t)(*s - '0');
		else if ((*s | 0x20) >= 'a' && (*s | 0x20) <= 'f')
			v = v << 4 | (uint64_t)((*s | 0x20) - 'a' + 10);
		else
			break;
	}
	return v;
}

/* Device `index` (uverbs<index>) of the tree; false when there is none. */
static bool dev_at(const char *root, uint32_t index, struct nldev *d)
{
	char rel[256], v[128];
	unsigned int major, minor;

	if (!root || index >= NL_MAX_DEVS)
		return false;
	memset(d, 0, sizeof(*d));
	d->index = index;
	snprintf(d->chardev, sizeof(d->chardev), "uverbs%u", index);
	snprintf(rel, sizeof(rel), "class/infiniband_verbs/%s/ibdev", d->chardev);
	if (read_line(root, rel, d->name, sizeof(d->name)) <= 0 || strchr(d->name, '/'))
		return false;
	snprintf(rel, sizeof(rel), "class/infiniband_verbs/%s/dev", d->chardev);
	if (read_line(root, rel, v, sizeof(v)) > 0 && sscanf(v, "%u:%u", &major, &minor) == 2)
		d->cdev = (minor & 0xffu) | (uint64_t)major << 8 | (uint64_t)(minor & ~0xffu) << 12;
	snprintf(rel, sizeof(rel), "class/infiniband_verbs/%s/abi_version", d->chardev);
	if (read_line(root, rel, v, sizeof(v)) > 0)
		d->abi = strtoull(v, NULL, 10);
#define DEVFILE(f) (snprintf(rel, sizeof(rel), "class/infiniband/%s/" f, d->name), \
		    read_line(root, rel, v, sizeof(v)) > 0)
	if (DEVFILE("node_type"))
		d->node_type = (uint8_t)strtoul(v, NULL, 10);
	if (DEVFILE("node_guid"))
		d->node_guid = guid_of(v);
	if (DEVFILE("sys_image_guid"))
		d->sys_image_guid = guid_of(v);
	if (DEVFILE("fw_ver"))
		snprintf(d->fw, sizeof(d->fw), "%s", v);
	if (DEVFILE("ports/1/link_layer"))
		d->ib = strcmp(v, "InfiniBand") == 0;
#undef DEVFILE
	/* what only netlink tells (the kernel has no sysfs file for it): softhca run
	 * writes it beside the class tree */
	snprintf(rel, sizeof(rel), "softhca/%s/cap_flags", d->name);
	if (read_line(root, rel, v, sizeof(v)) > 0)
		d->cap_flags = strtoull(v, NULL, 0);
	for (d->ports = 0; d->ports < NL_MAX_PORTS; d->ports++) {
		struct stat st;
		char path[4096];

		snprintf(path, sizeof(path), "%s/class/infiniband/%s/ports/%u", root, d->name,
			 d->ports + 1);
		if (stat(path, &st) || !S_ISDIR(st.st_mode))
			break;
	}
	return true;
}

/* -- answers ---------------------------------------------------------------------- */

struct msg {
	char buf[NL_MSG_MAX] __attribute__((aligned(8)));
	size_t len;
	bool full;
};

static struct nlmsghdr *msg_start(struct msg *m, uint16_t type, uint16_t flags,
				  const struct nlsock *s, const struct nlmsghdr *req)
{
	struct nlmsghdr *h = (struct nlmsghdr *)m->buf;

	memset(h, 0, NLMSG_HDRLEN);
	h->nlmsg_type = type;
	h->nlmsg_flags = flags;
	h->nlmsg_seq = req->nlmsg_seq;
	h->nlmsg_pid = s->portid;
	m->len = NLMSG_HDRLEN;
	m->full = false;
	return h;
}

static void put(struct msg *m, uint16_t type, const void *data, size_t len)
{
	struct nlattr *a;
	size_t total = NLA_ALIGN(NLA_HDRLEN + len);

	if (m->full || m->len + total > sizeof(m->buf)) {
		m->full = true;
		return;
	}
	a = (struct nlattr *)(m->buf + m->len);
	a->nla_len = (uint16_t)(NLA_HDRLEN + len);
	a->nla_type = type;
	memcpy((char *)a + NLA_HDRLEN, data, len);
	memset((char *)a + NLA_HDRLEN + len, 0, total - NLA_HDRLEN - len);
	m->len += total;
}

static void put_u8(struct msg *m, uint16_t t, uint8_t v) { put(m, t, &v, 1); }
static void put_u32(struct msg *m, uint16_t t, uint32_t v) { put(m, t, &v, 4); }
static void put_str(struct msg *m, uint16_t t, const char *s) { put(m, t, s, strlen(s) + 1); }

/* A u64 as the kernel's nla_put_u64_64bit: a PAD attribute first when the value would
 * not be 8-byte aligned. */
static void put_u64(struct msg *m, uint16_t t, uint64_t v)
{
	if ((m->len + NLA_HDRLEN) % 8)
		put(m, RDMA_NLDEV_ATTR_PAD, NULL, 0);
	put(m, t, &v, 8);
}

/* Queue one answer on the socket (it sends itself the datagram). A full receive
 * buffer drops it and the next receive fails ENOBUFS, as the kernel's overrun. */
static void deliver(const struct nlsock *s, struct msg *m)
{
	((struct nlmsghdr *)m->buf)->nlmsg_len = (uint32_t)m->len;
	if (syscall(SYS_sendto, s->fd, m->buf, m->len, MSG_DONTWAIT, NULL, 0) >= 0)
		return;
	if (s->no_enobufs)
		return;
	pthread_mutex_lock(&lock);
	struct nlsock *e = entry_of(s->fd);
	if (e)
		e->pending = ENOBUFS;
	pthread_mutex_unlock(&lock);
}

/* netlink_ack: NLMSG_ERROR with the error (0: an acknowledgement) and the request's
 * header, and its payload too for an error unless NETLINK_CAP_ACK was set. */
static void ack(const struct nlsock *s, const struct nlmsghdr *req, int err)
{
	struct msg m;
	struct nlmsgerr e;
	bool capped = err == 0 || s->cap_ack;
	size_t extra = capped ? 0 : req->nlmsg_len - NLMSG_HDRLEN;

	msg_start(&m, NLMSG_ERROR, capped ? NLM_F_CAPPED : 0, s, req);
	e.error = -err;
	memcpy(&e.msg, req, sizeof(e.msg));
	if (m.len + sizeof(e) + extra > sizeof(m.buf)) {
		/* a request too big to echo in our buffer: cap it, and say so */
		extra = 0;
		((struct nlmsghdr *)m.buf)->nlmsg_flags |= NLM_F_CAPPED;
	}
	memcpy(m.buf + m.len, &e, sizeof(e));
	m.len += sizeof(e);
	memcpy(m.buf + m.len, (const char *)req + NLMSG_HDRLEN, extra);
	m.len += NLMSG_ALIGN(extra);
	deliver(s, &m);
}

/* The end of a dump: NLMSG_DONE carrying the dump's error (0 when it went well). */
static void done(const struct nlsock *s, const struct nlmsghdr *req, int err)
{
	struct msg m;
	int v = -err;

	msg_start(&m, NLMSG_DONE, NLM_F_MULTI, s, req);
	memcpy(m.buf + m.len, &v, sizeof(v));
	m.len += sizeof(v);
	deliver(s, &m);
}

static void handle(struct msg *m, const struct nldev *d)
{
	put_u32(m, RDMA_NLDEV_ATTR_DEV_INDEX, d->index);
	put_str(m, RDMA_NLDEV_ATTR_DEV_NAME, d->name);
}

/* fill_dev_info: the device's handle, its last port, capabilities, firmware, GUIDs,
 * node type, protocol and adaptive moderation (off). */
static void dev_answer(const char *root, const struct nlsock *s, const struct nlmsghdr *req,
		       const struct nldev *d, uint16_t flags)
{
	struct msg m;

	(void)root;
	msg_start(&m, RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET), flags, s, req);
	handle(&m, d);
	put_u32(&m, RDMA_NLDEV_ATTR_PORT_INDEX, d->ports);
	put_u64(&m, RDMA_NLDEV_ATTR_CAP_FLAGS, d->cap_flags);
	if (d->fw[0])
		put_str(&m, RDMA_NLDEV_ATTR_FW_VERSION, d->fw);
	put_u64(&m, RDMA_NLDEV_ATTR_NODE_GUID, d->node_guid);
	put_u64(&m, RDMA_NLDEV_ATTR_SYS_IMAGE_GUID, d->sys_image_guid);
	put_u8(&m, RDMA_NLDEV_ATTR_DEV_NODE_TYPE, d->node_type);
	put_str(&m, RDMA_NLDEV_ATTR_DEV_PROTOCOL, d->ib ? "ib" : "roce");
	put_u8(&m, RDMA_NLDEV_ATTR_DEV_DIM, 0);
	deliver(s, &m);
}

/* fill_port_info: the handle, the port, its capability mask, for InfiniBand its LIDs,
 * its state and physical state, and its netdev. */
static void port_answer(const char *root, const struct nlsock *s, const struct nlmsghdr *req,
			const struct nldev *d, uint32_t port, uint16_t flags)
{
	struct msg m;
	char rel[256], v[128], path[4096];
	DIR *dir;
	struct dirent *de;

	msg_start(&m, RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_PORT_GET), flags, s, req);
	handle(&m, d);
	put_u32(&m, RDMA_NLDEV_ATTR_PORT_INDEX, port);
#define PORTFILE(f) (snprintf(rel, sizeof(rel), "class/infiniband/%s/ports/%u/" f, d->name, \
			      port), read_line(root, rel, v, sizeof(v)) > 0)
	put_u64(&m, RDMA_NLDEV_ATTR_CAP_FLAGS, PORTFILE("cap_mask") ? strtoull(v, NULL, 16) : 0);
	if (d->ib) {
		put_u64(&m, RDMA_NLDEV_ATTR_SUBNET_PREFIX,
			PORTFILE("gids/0") ? guid_of(v) : 0);
		put_u32(&m, RDMA_NLDEV_ATTR_LID,
			PORTFILE("lid") ? (uint32_t)strtoul(v, NULL, 16) : 0);
		put_u32(&m, RDMA_NLDEV_ATTR_SM_LID,
			PORTFILE("sm_lid") ? (uint32_t)strtoul(v, NULL, 16) : 0);
		put_u8(&m, RDMA_NLDEV_ATTR_LMC,
		       PORTFILE("lid_mask_count") ? (uint8_t)strtoul(v, NULL, 10) : 0);
	}
	put_u8(&m, RDMA_NLDEV_ATTR_PORT_STATE,
	       PORTFILE("state") ? (uint8_t)strtoul(v, NULL, 10) : 0);
	put_u8(&m, RDMA_NLDEV_ATTR_PORT_PHYS_STATE,
	       PORTFILE("phys_state") ? (uint8_t)strtoul(v, NULL, 10) : 0);
#undef PORTFILE
	/* the netdev: the device's device/net/<if> (its ifindex file) */
	snprintf(path, sizeof(path), "%s/class/infiniband/%s/device/net", root, d->name);
	dir = opendir(path);
	while (dir && (de = readdir(dir))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(rel, sizeof(rel), "class/infiniband/%s/device/net/%.64s/ifindex",
			 d->name, de->d_name);
		if (read_line(root, rel, v, sizeof(v)) > 0) {
			put_u32(&m, RDMA_NLDEV_ATTR_NDEV_INDEX, (uint32_t)strtoul(v, NULL, 10));
			put_str(&m, RDMA_NLDEV_ATTR_NDEV_NAME, de->d_name);
		}
		break;
	}
	if (dir)
		closedir(dir);
	deliver(s, &m);
}

/* The request's attributes, parsed as the kernel's nlmsg_parse_deprecated: an
 * attribute that runs past the message ends the parse; a known one shorter than its
 * type is an error (EINVAL for the command). */
struct req_attrs {
	bool has_dev, has_port, has_type;
	uint32_t dev, port;
	char type[32];
};

static int parse(const struct nlmsghdr *h, struct req_attrs *r)
{
	const char *p = (const char *)h + NLMSG_HDRLEN;
	size_t rem = h->nlmsg_len - NLMSG_HDRLEN;

	memset(r, 0, sizeof(*r));
	while (rem >= NLA_HDRLEN) {
		const struct nlattr *a = (const struct nlattr *)p;
		size_t len = a->nla_len;
		const char *data = p + NLA_HDRLEN;

		if (len < NLA_HDRLEN || len > rem)
			break;
		switch (a->nla_type & NLA_TYPE_MASK) {
		case RDMA_NLDEV_ATTR_DEV_INDEX:
			if (len < NLA_HDRLEN + 4)
				return EINVAL;
			memcpy(&r->dev, data, 4);
			r->has_dev = true;
			break;
		case RDMA_NLDEV_ATTR_PORT_INDEX:
			if (len < NLA_HDRLEN + 4)
				return EINVAL;
			memcpy(&r->port, data, 4);
			r->has_port = true;
			break;
		case RDMA_NLDEV_ATTR_CHARDEV_TYPE: {
			/* the kernel's policy: a string of at most 15 characters */
			size_t n = strnlen(data, len - NLA_HDRLEN);

			if (n >= 16)
				return EINVAL;
			memcpy(r->type, data, n);
			r->type[n] = 0;
			r->has_type = true;
			break;
		}
		}
		if (NLA_ALIGN(len) >= rem)
			break;
		p += NLA_ALIGN(len);
		rem -= NLA_ALIGN(len);
	}
	return 0;
}

/* One request (rdma_nl_rcv_msg and nldev's handlers): its error, 0 when answered.
 * *dumped: a dump was answered (its NLMSG_DONE carries its error; no ack follows). */
static int request(const char *root, const struct nlsock *s, const struct nlmsghdr *h,
		   bool *dumped)
{
	unsigned int client = RDMA_NL_GET_CLIENT(h->nlmsg_type);
	unsigned int op = RDMA_NL_GET_OP(h->nlmsg_type);
	bool dump = h->nlmsg_flags & NLM_F_DUMP;
	struct req_attrs r;
	struct nldev d;
	int err;

	/* The kernel's other clients (the iWARP port mapper, the SA's local service) have
	 * no module here: it answers EINVAL, as for an op no client has. */
	if (client != RDMA_NL_NLDEV || op >= RDMA_NLDEV_NUM_OPS)
		return EINVAL;
	err = parse(h, &r);
	switch (op) {
	case RDMA_NLDEV_CMD_GET:
		if (dump) {
			*dumped = true;
			for (uint32_t i = 0; dev_at(root, i, &d); i++)
				dev_answer(root, s, h, &d, NLM_F_MULTI);
			done(s, h, 0);
			return 0;
		}
		if (err || !r.has_dev || !dev_at(root, r.dev, &d))
			return EINVAL;
		dev_answer(root, s, h, &d, 0);
		return 0;
	case RDMA_NLDEV_CMD_PORT_GET:
		if (dump) {
			/* a port dump is of one device, which the request must name */
			*dumped = true;
			if (err || !r.has_dev || !dev_at(root, r.dev, &d)) {
				done(s, h, EINVAL);
				return 0;
			}
			for (uint32_t p = 1; p <= d.ports; p++)
				port_answer(root, s, h, &d, p, NLM_F_MULTI);
			done(s, h, 0);
			return 0;
		}
		if (err || !r.has_dev || !r.has_port || !dev_at(root, r.dev, &d) ||
		    r.port < 1 || r.port > d.ports)
			return EINVAL;
		port_answer(root, s, h, &d, r.port, 0);
		return 0;
	case RDMA_NLDEV_CMD_SYS_GET: {
		struct msg m;

		if (dump)
			return EINVAL;	/* no dump of it */
		msg_start(&m, h->nlmsg_type, 0, s, h);
		/* network namespaces shared; no copy-on-fork of registered pages (a forked
		 * child shares them: docs/native.md, fork() after ibv_reg_mr) */
		put_u8(&m, RDMA_NLDEV_SYS_ATTR_NETNS_MODE, 1);
		put_u8(&m, RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK, 0);
		deliver(s, &m);
		return 0;
	}
	case RDMA_NLDEV_CMD_GET_CHARDEV: {
		struct msg m;

		if (dump || err || !r.has_type)
			return EINVAL;
		if (r.has_dev && !dev_at(root, r.dev, &d))
			return EINVAL;
		/* uverbs of a device is the one char device modelled; another client
		 * (umad, rdma_cm) has none here */
		if (strcmp(r.type, "uverbs") || !r.has_dev)
			return EOPNOTSUPP;
		msg_start(&m, h->nlmsg_type, 0, s, h);
		put_u64(&m, RDMA_NLDEV_ATTR_CHARDEV, d.cdev);
		put_u64(&m, RDMA_NLDEV_ATTR_CHARDEV_ABI, d.abi);
		put_str(&m, RDMA_NLDEV_ATTR_CHARDEV_NAME, d.chardev);
		deliver(s, &m);
		return 0;
	}
	case RDMA_NLDEV_CMD_UNSPEC:
	case RDMA_NLDEV_CMD_SYS_SET + 1:	/* no op of the kernel's has this number */
		return EINVAL;
	default:
		/* settings, links, resources, counters: a kernel's, not modelled here */
		return EOPNOTSUPP;
	}
}

/* netlink_rcv_skb over one send's bytes: each whole message in turn; a header that is
 * short or runs past the end ends the batch silently, as the kernel drops it. */
static void receive(const char *root, const struct nlsock *s, const char *buf, size_t len)
{
	while (len >= NLMSG_HDRLEN) {
		struct nlmsghdr h;
		const struct nlmsghdr *req = (const struct nlmsghdr *)buf;
		bool dumped = false;
		size_t step;
		int err = 0;

		memcpy(&h, buf, sizeof(h));
		if (h.nlmsg_len < NLMSG_HDRLEN || h.nlmsg_len > len)
			return;
		/* only requests are handled; control messages are skipped (acked if asked) */
		if ((h.nlmsg_flags & NLM_F_REQUEST) && h.nlmsg_type >= NLMSG_MIN_TYPE)
			err = request(root, s, req, &dumped);
		if (!dumped && ((h.nlmsg_flags & NLM_F_ACK) || err))
			ack(s, req, err);
		step = NLMSG_ALIGN(h.nlmsg_len);
		if (step >= len)
			return;
		buf += step;
		len -= step;
	}
}

/* -- the calls -------------------------------------------------------------------- */

EXPORT int socket(int domain, int type, int protocol)
{
	int base = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC), fd, i;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	socklen_t alen = sizeof(a);
	struct stat st;

	if (domain != AF_NETLINK || protocol != NETLINK_RDMA || !sysfs_root())
		return real_socket ? real_socket(domain, type, protocol)
				   : (int)syscall(SYS_socket, domain, type, protocol);
	if (base != SOCK_RAW && base != SOCK_DGRAM) {
		errno = ESOCKTNOSUPPORT;
		return -1;
	}
	fd = (int)syscall(SYS_socket, AF_UNIX, SOCK_DGRAM | (type & (SOCK_NONBLOCK | SOCK_CLOEXEC)),
			  0);
	if (fd < 0)
		return -1;
	/* autobind (an address of the kernel's choosing), then connect to it: the socket
	 * takes datagrams from itself only */
	if (syscall(SYS_bind, fd, &a, sizeof(sa_family_t)) ||
	    syscall(SYS_getsockname, fd, &a, &alen) || syscall(SYS_connect, fd, &a, alen) ||
	    fstat(fd, &st)) {
		int e = errno;

		close(fd);
		errno = e;
		return -1;
	}
	pthread_mutex_lock(&lock);
	for (i = 0; i < NL_MAX_SOCKS && socks[i].fd >= 0 && socks[i].fd != fd; i++)
		;
	if (i == NL_MAX_SOCKS) {
		sweep();
		for (i = 0; i < NL_MAX_SOCKS && socks[i].fd >= 0; i++)
			;
	}
	if (i == NL_MAX_SOCKS) {
		pthread_mutex_unlock(&lock);
		close(fd);
		errno = ENOBUFS;
		return -1;
	}
	if (socks[i].fd != fd)
		__atomic_add_fetch(&nsocks, 1, __ATOMIC_RELEASE);
	socks[i] = (struct nlsock){ .fd = fd, .dev = st.st_dev, .ino = st.st_ino, .type = base };
	pthread_mutex_unlock(&lock);
	return fd;
}

EXPORT int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct nlsock s;
	struct sockaddr_nl nl;
	struct nlsock *e;
	int rc = 0;

	if (!lookup(fd, &s))
		return real_bind ? real_bind(fd, addr, len) : (int)syscall(SYS_bind, fd, addr, len);
	if (!addr || len < sizeof(nl)) {
		errno = EINVAL;
		return -1;
	}
	memcpy(&nl, addr, sizeof(nl));
	if (nl.nl_family != AF_NETLINK) {
		errno = EINVAL;
		return -1;
	}
	pthread_mutex_lock(&lock);
	e = entry_of(fd);
	if (!e) {
		rc = EBADF;
	} else if (e->portid && nl.nl_pid && nl.nl_pid != e->portid) {
		rc = EINVAL;	/* bound already, to another port id */
	} else if (!e->portid && nl.nl_pid) {
		for (int i = 0; i < NL_MAX_SOCKS; i++)
			if (socks[i].fd >= 0 && socks[i].portid == nl.nl_pid)
				rc = EADDRINUSE;
		if (!rc)
			e->portid = nl.nl_pid;
	} else if (!e->portid) {
		e->portid = autobind_portid();
	}
	if (!rc && e)
		e->groups = nl.nl_groups;
	pthread_mutex_unlock(&lock);
	if (rc) {
		errno = rc;
		return -1;
	}
	return 0;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	struct nlsock s;
	struct sockaddr_nl nl;

	if (!lookup(fd, &s))
		return real_connect ? real_connect(fd, addr, len)
				    : (int)syscall(SYS_connect, fd, addr, len);
	if (!addr || len < sizeof(sa_family_t)) {
		errno = EINVAL;
		return -1;
	}
	if (addr->sa_family == AF_UNSPEC)
		return 0;
	if (len < sizeof(nl) || addr->sa_family != AF_NETLINK) {
		errno = EINVAL;
		return -1;
	}
	memcpy(&nl, addr, sizeof(nl));
	if (nl.nl_pid || nl.nl_groups) {
		/* another process's netlink socket, or a group: only the kernel is here */
		errno = ECONNREFUSED;
		return -1;
	}
	set_portid(fd);
	return 0;
}

static int nl_name(int fd, struct sockaddr *addr, socklen_t *len, bool peer)
{
	struct nlsock s;
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };

	if (!addr || !len) {
		errno = EFAULT;
		return -1;
	}
	if (lookup(fd, &s) && !peer) {
		nl.nl_pid = s.portid;
		nl.nl_groups = s.groups;
	}
	memcpy(addr, &nl, *len < sizeof(nl) ? *len : sizeof(nl));
	*len = sizeof(nl);
	return 0;
}

EXPORT int getsockname(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct nlsock s;

	if (!lookup(fd, &s))
		return real_getsockname ? real_getsockname(fd, addr, len)
					: (int)syscall(SYS_getsockname, fd, addr, len);
	return nl_name(fd, addr, len, false);
}

EXPORT int getpeername(int fd, struct sockaddr *addr, socklen_t *len)
{
	struct nlsock s;

	if (!lookup(fd, &s))
		return real_getpeername ? real_getpeername(fd, addr, len)
					: (int)syscall(SYS_getpeername, fd, addr, len);
	return nl_name(fd, addr, len, true);
}

EXPORT int setsockopt(int fd, int level, int opt, const void *val, socklen_t len)
{
	struct nlsock s;
	struct nlsock *e;
	int v;

	if (level != SOL_NETLINK || !lookup(fd, &s))
		return real_setsockopt ? real_setsockopt(fd, level, opt, val, len)
				       : (int)syscall(SYS_setsockopt, fd, level, opt, val, len);
	if (!val || len < sizeof(int)) {
		errno = EINVAL;
		return -1;
	}
	memcpy(&v, val, sizeof(v));
	pthread_mutex_lock(&lock);
	e = entry_of(fd);
	switch (opt) {
	case NETLINK_CAP_ACK: if (e) e->cap_ack = v; break;
	case NETLINK_EXT_ACK: if (e) e->ext_ack = v; break;
	case NETLINK_NO_ENOBUFS: if (e) e->no_enobufs = v; break;
	case NETLINK_GET_STRICT_CHK: if (e) e->strict = v; break;
	/* RDMA netlink's groups: nothing is ever sent to them here (the devices of a run
	 * never change) */
	case NETLINK_ADD_MEMBERSHIP:
	case NETLINK_DROP_MEMBERSHIP:
	case NETLINK_BROADCAST_ERROR:
	case NETLINK_LISTEN_ALL_NSID:
		break;
	default:
		pthread_mutex_unlock(&lock);
		errno = ENOPROTOOPT;
		return -1;
	}
	pthread_mutex_unlock(&lock);
	return 0;
}

EXPORT int getsockopt(int fd, int level, int opt, void *val, socklen_t *len)
{
	struct nlsock s;
	int v;

	if ((level != SOL_NETLINK && level != SOL_SOCKET) || !lookup(fd, &s) ||
	    (level == SOL_SOCKET && opt != SO_DOMAIN && opt != SO_PROTOCOL && opt != SO_TYPE))
		return real_getsockopt ? real_getsockopt(fd, level, opt, val, len)
				       : (int)syscall(SYS_getsockopt, fd, level, opt, val, len);
	if (!val || !len || *len < sizeof(int)) {
		errno = EINVAL;
		return -1;
	}
	if (level == SOL_SOCKET)
		v = opt == SO_DOMAIN ? AF_NETLINK : opt == SO_PROTOCOL ? NETLINK_RDMA : s.type;
	else if (opt == NETLINK_CAP_ACK)
		v = s.cap_ack;
	else if (opt == NETLINK_EXT_ACK)
		v = s.ext_ack;
	else if (opt == NETLINK_NO_ENOBUFS)
		v = s.no_enobufs;
	else if (opt == NETLINK_GET_STRICT_CHK)
		v = s.strict;
	else {
		errno = ENOPROTOOPT;
		return -1;
	}
	memcpy(val, &v, sizeof(v));
	*len = sizeof(v);
	return 0;
}

/* A send to the kernel: checked as netlink_sendmsg checks it, then answered. */
static ssize_t nl_send(const struct nlsock *s0, const struct iovec *iov, size_t iovlen,
		       const void *name, socklen_t namelen)
{
	const char *root = sysfs_root();
	struct nlsock s;
	size_t total = 0;
	int sndbuf = 0;
	socklen_t sl = sizeof(sndbuf);
	char small[NL_GATHER] __attribute__((aligned(8)));
	char *buf;

	if (name && namelen) {
		struct sockaddr_nl nl;

		if (namelen < sizeof(nl) || ((const struct sockaddr *)name)->sa_family != AF_NETLINK) {
			errno = EINVAL;
			return -1;
		}
		memcpy(&nl, name, sizeof(nl));
		if (nl.nl_groups) {
			errno = EPERM;	/* RDMA netlink takes no sends to a group */
			return -1;
		}
		if (nl.nl_pid) {
			errno = ECONNREFUSED;	/* another socket: only the kernel is here */
			return -1;
		}
	}
	if (iovlen > IOV_MAX) {
		errno = EMSGSIZE;
		return -1;
	}
	for (size_t i = 0; i < iovlen; i++) {
		if (iov[i].iov_len > SIZE_MAX - total) {
			errno = EINVAL;
			return -1;
		}
		total += iov[i].iov_len;
	}
	if (syscall(SYS_getsockopt, s0->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, &sl) || sndbuf < 32 ||
	    total > (size_t)sndbuf - 32) {
		errno = EMSGSIZE;
		return -1;
	}
	set_portid(s0->fd);
	if (!lookup(s0->fd, &s)) {
		errno = EBADF;
		return -1;
	}
	/* a tree gone since the socket was made: answered as a kernel with no devices */
	/* the program's own buffer when it is one and aligned as a message must be */
	if (iovlen == 1 && !((uintptr_t)iov[0].iov_base % NLMSG_ALIGNTO)) {
		receive(root, &s, iov[0].iov_base, total);
		return (ssize_t)total;
	}
	buf = total <= sizeof(small) ? small : malloc(total);
	if (!buf) {
		errno = ENOBUFS;
		return -1;
	}
	total = 0;
	for (size_t i = 0; i < iovlen; i++) {
		memcpy(buf + total, iov[i].iov_base, iov[i].iov_len);
		total += iov[i].iov_len;
	}
	receive(root, &s, buf, total);
	if (buf != small)
		free(buf);
	return (ssize_t)total;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	struct nlsock s;

	if (!lookup(fd, &s))
		return real_sendmsg ? real_sendmsg(fd, msg, flags)
				    : syscall(SYS_sendmsg, fd, msg, flags);
	if (!msg || (msg->msg_iovlen && !msg->msg_iov)) {
		errno = EFAULT;
		return -1;
	}
	if (flags & MSG_OOB) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return nl_send(&s, msg->msg_iov, msg->msg_iovlen, msg->msg_name, msg->msg_namelen);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t len, int flags,
		      const struct sockaddr *to, socklen_t tolen)
{
	struct nlsock s;
	struct iovec iov = { (void *)buf, len };

	if (!lookup(fd, &s))
		return real_sendto ? real_sendto(fd, buf, len, flags, to, tolen)
				   : syscall(SYS_sendto, fd, buf, len, flags, to, tolen);
	if (flags & MSG_OOB) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return nl_send(&s, &iov, 1, to, tolen);
}

EXPORT ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	struct nlsock s;
	struct iovec iov = { (void *)buf, len };

	if (!lookup(fd, &s))
		return real_send ? real_send(fd, buf, len, flags)
				 : syscall(SYS_sendto, fd, buf, len, flags, NULL, 0);
	if (flags & MSG_OOB) {
		errno = EOPNOTSUPP;
		return -1;
	}
	return nl_send(&s, &iov, 1, NULL, 0);
}

EXPORT ssize_t write(int fd, const void *buf, size_t len)
{
	struct nlsock s;
	struct iovec iov = { (void *)buf, len };

	if (!lookup(fd, &s))
		return real_write ? real_write(fd, buf, len) : syscall(SYS_write, fd, buf, len);
	return nl_send(&s, &iov, 1, NULL, 0);
}

/* An error the socket holds for its next receive (ENOBUFS after an overrun). */
static int take_pending(int fd)
{
	struct nlsock *e;
	int err = 0;

	pthread_mutex_lock(&lock);
	e = entry_of(fd);
	if (e) {
		err = e->pending;
		e->pending = 0;
	}
	pthread_mutex_unlock(&lock);
	return err;
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags)
{
	struct nlsock s;
	struct msghdr m;
	ssize_t n;
	int err;

	if (!lookup(fd, &s))
		return real_recvmsg ? real_recvmsg(fd, msg, flags)
				    : syscall(SYS_recvmsg, fd, msg, flags);
	if (!msg) {
		errno = EFAULT;
		return -1;
	}
	err = take_pending(fd);
	if (err) {
		errno = err;
		return -1;
	}
	/* the AF_UNIX sender's address is not the program's business: the kernel's is */
	m = *msg;
	m.msg_name = NULL;
	m.msg_namelen = 0;
	n = syscall(SYS_recvmsg, fd, &m, flags);
	if (n < 0)
		return -1;
	msg->msg_flags = m.msg_flags;
	msg->msg_controllen = m.msg_controllen;
	if (msg->msg_name) {
		struct sockaddr_nl nl = { .nl_family = AF_NETLINK };

		memcpy(msg->msg_name, &nl,
		       msg->msg_namelen < sizeof(nl) ? msg->msg_namelen : sizeof(nl));
		msg->msg_namelen = sizeof(nl);
	}
	return n;
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
			socklen_t *fromlen)
{
	struct nlsock s;
	struct iovec iov = { buf, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	ssize_t n;

	if (!lookup(fd, &s))
		return real_recvfrom ? real_recvfrom(fd, buf, len, flags, from, fromlen)
				     : syscall(SYS_recvfrom, fd, buf, len, flags, from, fromlen);
	if (from && fromlen) {
		m.msg_name = from;
		m.msg_namelen = *fromlen;
	}
	n = recvmsg(fd, &m, flags);
	if (n >= 0 && from && fromlen)
		*fromlen = m.msg_namelen;
	return n;
}

EXPORT ssize_t recv(int fd, void *buf, size_t len, int flags)
{
	struct nlsock s;
	int err;

	if (!lookup(fd, &s))
		return real_recv ? real_recv(fd, buf, len, flags)
				 : syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
	err = take_pending(fd);
	if (err) {
		errno = err;
		return -1;
	}
	return syscall(SYS_recvfrom, fd, buf, len, flags, NULL, NULL);
}
