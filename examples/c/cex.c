/* The shared boilerplate of the example programs (cex.h says what each part does). */
#define _GNU_SOURCE
#include "cex.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* How long one completion may take before the program gives up: the device is a daemon
 * on the same (possibly busy) CPUs. */
#define CEX_WAIT_SECONDS 30
#define CEX_STASH 64

static struct ibv_wc stash[CEX_STASH];
static int stashed;
static uint64_t recv_wr_id;

void cex_die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	va_start(ap, fmt);
	fputs("error: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	printf("FAIL\n");
	exit(1);
}

void cex_args(struct cex *c, int argc, char **argv)
{
	int opt;

	memset(c, 0, sizeof(*c));
	c->prog = argv[0];
	c->port = CEX_DEFAULT_PORT;
	c->sock = -1;
	c->next_wr_id = 1;
	while ((opt = getopt(argc, argv, "p:d:g:")) != -1) {
		switch (opt) {
		case 'p':
			c->port = atoi(optarg);
			break;
		case 'd':
			c->dev_name = optarg;
			break;
		case 'g':
			c->gid_index = atoi(optarg);
			break;
		default:
			fprintf(stderr, "usage: %s [-p PORT] [-d DEVICE] [-g GID_INDEX] [ADDR]\n",
				argv[0]);
			exit(2);
		}
	}
	if (optind < argc)
		c->peer_addr = argv[optind++];
	if (optind < argc || c->port <= 0 || c->port > 65535) {
		fprintf(stderr, "usage: %s [-p PORT] [-d DEVICE] [-g GID_INDEX] [ADDR]\n", argv[0]);
		exit(2);
	}
	printf("role %s\n", cex_is_target(c) ? "target" : "initiator");
}

static struct ibv_context *open_ctx(struct ibv_device *dev)
{
	struct mlx5dv_context_attr attr = { .flags = MLX5DV_CONTEXT_FLAGS_DEVX };
	struct ibv_context *ctx;

	/* mlx5dv_dek_create(3) and mlx5dv_mkey_check(3) ask for a DEVX context. */
	ctx = mlx5dv_open_device(dev, &attr);
	if (ctx)
		return ctx;
	fprintf(stderr, "note: mlx5dv_open_device: %s; trying ibv_open_device\n",
		strerror(errno));
	return ibv_open_device(dev);
}

void cex_open_qp(struct cex *c, struct ibv_context *ctx, int cqe, uint32_t max_wr,
		 uint32_t max_sge)
{
	struct ibv_qp_init_attr_ex qa = {};
	struct mlx5dv_qp_init_attr dva = {};

	c->ctx = ctx;
	c->pd = ibv_alloc_pd(ctx);
	if (!c->pd)
		cex_die("ibv_alloc_pd: %s", strerror(errno));
	c->cq = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
	if (!c->cq)
		cex_die("ibv_create_cq: %s", strerror(errno));

	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.cap.max_send_wr = max_wr;
	qa.cap.max_recv_wr = max_wr;
	qa.cap.max_send_sge = max_sge;
	qa.cap.max_recv_sge = max_sge;
	qa.pd = c->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_RDMA_READ;
	dva.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dva.send_ops_flags = MLX5DV_QP_EX_WITH_MKEY_CONFIGURE;
	c->qp = mlx5dv_create_qp(ctx, &qa, &dva);
	if (!c->qp)
		cex_die("mlx5dv_create_qp: %s", strerror(errno));
	c->qpx = ibv_qp_to_qp_ex(c->qp);
	c->mqpx = mlx5dv_qp_ex_from_ibv_qp_ex(c->qpx);
	if (!c->qpx || !c->mqpx)
		cex_die("the QP has no extended interface");
}

void cex_open(struct cex *c)
{
	struct ibv_device **list, *dev = NULL;
	struct ibv_context *ctx;
	int n, i;

	list = ibv_get_device_list(&n);
	if (!list || n == 0)
		cex_die("no RDMA device");
	for (i = 0; i < n && !dev; i++)
		if (!c->dev_name || !strcmp(ibv_get_device_name(list[i]), c->dev_name))
			dev = list[i];
	if (!dev)
		cex_die("no device %s", c->dev_name);
	if (!mlx5dv_is_supported(dev))
		cex_die("%s is not an mlx5 device", ibv_get_device_name(dev));
	ctx = open_ctx(dev);
	if (!ctx)
		cex_die("cannot open %s: %s", ibv_get_device_name(dev), strerror(errno));
	ibv_free_device_list(list);
	cex_open_qp(c, ctx, 256, 64, 4);
}

static void write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t n = write(fd, buf, len);

		if (n <= 0)
			cex_die("write to the peer: %s", n ? strerror(errno) : "closed");
		buf += n;
		len -= (size_t)n;
	}
}

/* One '\n'-terminated line from the peer, without the '\n'. */
static void read_line(int fd, char *buf, size_t size)
{
	size_t i = 0;

	while (i + 1 < size) {
		ssize_t n = read(fd, buf + i, 1);

		if (n <= 0)
			cex_die("read from the peer: %s", n ? strerror(errno) : "closed");
		if (buf[i] == '\n')
			break;
		i++;
	}
	buf[i] = '\0';
}

static int tcp_listen_accept(int port)
{
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons(port) };
	int s, fd, one = 1, zero = 0;

	s = socket(AF_INET6, SOCK_STREAM, 0);
	if (s < 0)
		cex_die("socket: %s", strerror(errno));
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
	a.sin6_addr = in6addr_any;
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
		cex_die("listen on port %d: %s", port, strerror(errno));
	fd = accept(s, NULL, NULL);
	if (fd < 0)
		cex_die("accept: %s", strerror(errno));
	close(s);
	return fd;
}

static int tcp_connect(const char *host, int port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *r;
	char service[16];
	int fd = -1, tries, rc;

	snprintf(service, sizeof(service), "%d", port);
	rc = getaddrinfo(host, service, &hints, &res);
	if (rc)
		cex_die("%s: %s", host, gai_strerror(rc));
	/* The passive side may still be setting up: retry for a while. */
	for (tries = 0; tries < 100 && fd < 0; tries++) {
		for (r = res; r; r = r->ai_next) {
			fd = socket(r->ai_family, r->ai_socktype, r->ai_protocol);
			if (fd < 0)
				continue;
			if (!connect(fd, r->ai_addr, r->ai_addrlen))
				break;
			close(fd);
			fd = -1;
		}
		if (fd < 0)
			usleep(100000);
	}
	freeaddrinfo(res);
	if (fd < 0)
		cex_die("cannot connect to %s:%d", host, port);
	return fd;
}

static void to_rts(struct cex *c)
{
	struct ibv_qp_attr a = {};

	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.pkey_index = 0;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		cex_die("QP to INIT: %s", strerror(errno));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = c->peer.qpn;
	a.rq_psn = c->peer.psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = c->peer.gid;
	a.ah_attr.grh.sgid_index = c->gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		cex_die("QP to RTR: %s", strerror(errno));

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = c->me.psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		cex_die("QP to RTS: %s", strerror(errno));
}

/* The exchange line: "cex QPN PSN GID RKEY ADDR LEN", hex, the GID as 32 digits. */
static void format_peer(char *buf, size_t size, const struct cex_peer *p)
{
	char gid[33];
	int i;

	for (i = 0; i < 16; i++)
		sprintf(gid + 2 * i, "%02x", p->gid.raw[i]);
	snprintf(buf, size, "cex %06x %06x %s %08x %016llx %016llx\n", p->qpn, p->psn, gid,
		 p->rkey, (unsigned long long)p->addr, (unsigned long long)p->len);
}

static void parse_peer(const char *line, struct cex_peer *p)
{
	char gid[33];
	unsigned long long addr, len;
	unsigned int qpn, psn, rkey, byte;
	int i;

	if (sscanf(line, "cex %x %x %32s %x %llx %llx", &qpn, &psn, gid, &rkey, &addr, &len) != 6
	    || strlen(gid) != 32)
		cex_die("the peer sent %s, not an exchange line", line);
	p->qpn = qpn;
	p->psn = psn;
	p->rkey = rkey;
	p->addr = addr;
	p->len = len;
	for (i = 0; i < 16; i++) {
		sscanf(gid + 2 * i, "%2x", &byte);
		p->gid.raw[i] = (uint8_t)byte;
	}
}

void cex_connect(struct cex *c, uint32_t rkey, uint64_t addr, uint64_t len)
{
	char line[256];

	c->me.qpn = c->qp->qp_num;
	c->me.psn = (uint32_t)(getpid() * 7919u) & 0xffffff;
	if (ibv_query_gid(c->ctx, 1, c->gid_index, &c->me.gid))
		cex_die("ibv_query_gid: %s", strerror(errno));
	c->me.rkey = rkey;
	c->me.addr = addr;
	c->me.len = len;
	if (cex_is_target(c))
		c->sock = tcp_listen_accept(c->port);
	else
		c->sock = tcp_connect(c->peer_addr, c->port);
	format_peer(line, sizeof(line), &c->me);
	write_all(c->sock, line, strlen(line));
	read_line(c->sock, line, sizeof(line));
	parse_peer(line, &c->peer);
	to_rts(c);
	printf("connected local_qpn 0x%06x remote_qpn 0x%06x remote_rkey 0x%08x remote_len %llu\n",
	       c->me.qpn, c->peer.qpn, c->peer.rkey, (unsigned long long)c->peer.len);
	fflush(stdout);
}

void cex_barrier(struct cex *c, const char *name)
{
	char line[128], got[128];

	snprintf(line, sizeof(line), "at %s\n", name);
	write_all(c->sock, line, strlen(line));
	read_line(c->sock, got, sizeof(got));
	line[strlen(line) - 1] = '\0';
	if (strcmp(line, got))
		cex_die("out of step: here %s, the peer says %s", line, got);
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The completion of wr_id; others that come first are kept for their own waiters. */
static struct ibv_wc wait_wc(struct cex *c, uint64_t wr_id, const char *what)
{
	double deadline = now() + CEX_WAIT_SECONDS;
	struct ibv_wc wc;
	int i, n;

	for (;;) {
		for (i = 0; i < stashed; i++) {
			if (stash[i].wr_id == wr_id) {
				wc = stash[i];
				stash[i] = stash[--stashed];
				if (wc.status != IBV_WC_SUCCESS)
					cex_die("%s completed with %s (vendor_err 0x%x)", what,
						ibv_wc_status_str(wc.status), wc.vendor_err);
				return wc;
			}
		}
		n = ibv_poll_cq(c->cq, 1, &wc);
		if (n < 0)
			cex_die("ibv_poll_cq: %d", n);
		if (n == 1) {
			if (stashed == CEX_STASH)
				cex_die("too many unclaimed completions");
			stash[stashed++] = wc;
			continue;
		}
		if (now() > deadline)
			cex_die("no completion for %s within %d s", what, CEX_WAIT_SECONDS);
	}
}

static uint64_t start_wr(struct cex *c, unsigned int flags)
{
	uint64_t id = c->next_wr_id++;

	ibv_wr_start(c->qpx);
	c->qpx->wr_id = id;
	c->qpx->wr_flags = flags;
	return id;
}

static void complete_wr(struct cex *c, uint64_t id, const char *what)
{
	int rc = ibv_wr_complete(c->qpx);

	if (rc)
		cex_die("%s: ibv_wr_complete: %s", what, strerror(rc));
	wait_wc(c, id, what);
}

void cex_send(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len)
{
	uint64_t id = start_wr(c, IBV_SEND_SIGNALED);

	ibv_wr_send(c->qpx);
	ibv_wr_set_sge(c->qpx, lkey, addr, len);
	complete_wr(c, id, "SEND");
}

uint64_t cex_post_recv(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len)
{
	struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	int rc;

	wr.wr_id = recv_wr_id = c->next_wr_id++;
	rc = ibv_post_recv(c->qp, &wr, &bad);
	if (rc)
		cex_die("ibv_post_recv: %s", strerror(rc));
	return wr.wr_id;
}

void cex_wait_recv(struct cex *c, uint32_t expect_len)
{
	cex_wait_recv_wr(c, recv_wr_id, expect_len);
}

void cex_wait_recv_wr(struct cex *c, uint64_t wr_id, uint32_t expect_len)
{
	struct ibv_wc wc = wait_wc(c, wr_id, "RECV");

	if (wc.opcode != IBV_WC_RECV || wc.byte_len != expect_len)
		cex_die("RECV completed as opcode %d with %u bytes, not %u", wc.opcode,
			wc.byte_len, expect_len);
}

void cex_rdma_write(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len,
		    uint32_t rkey, uint64_t raddr)
{
	uint64_t id = start_wr(c, IBV_SEND_SIGNALED);

	ibv_wr_rdma_write(c->qpx, rkey, raddr);
	ibv_wr_set_sge(c->qpx, lkey, addr, len);
	complete_wr(c, id, "RDMA_WRITE");
}

void cex_rdma_read(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len,
		   uint32_t rkey, uint64_t raddr)
{
	uint64_t id = start_wr(c, IBV_SEND_SIGNALED);

	ibv_wr_rdma_read(c->qpx, rkey, raddr);
	ibv_wr_set_sge(c->qpx, lkey, addr, len);
	complete_wr(c, id, "RDMA_READ");
}

struct mlx5dv_mkey *cex_create_mkey(struct cex *c, uint32_t create_flags, uint16_t max_entries)
{
	struct mlx5dv_mkey_init_attr a = {
		.pd = c->pd, .create_flags = create_flags, .max_entries = max_entries,
	};
	struct mlx5dv_mkey *mkey = mlx5dv_create_mkey(&a);

	if (!mkey)
		cex_die("mlx5dv_create_mkey(0x%x): %s", create_flags, strerror(errno));
	printf("mkey lkey 0x%08x rkey 0x%08x create_flags 0x%x\n", mkey->lkey, mkey->rkey,
	       create_flags);
	return mkey;
}

void cex_configure(struct cex *c, struct mlx5dv_mkey *mkey, uint32_t access,
		   const struct cex_layout *layout, const struct mlx5dv_sig_block_attr *sig,
		   const struct mlx5dv_crypto_attr *crypto)
{
	struct mlx5dv_mkey_conf_attr conf = {};
	/* access flags and the layout, then one setter per attribute given */
	uint16_t setters = 2 + (sig != NULL) + (crypto != NULL);
	uint64_t id = start_wr(c, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
	struct ibv_wc wc;
	int rc;

	mlx5dv_wr_mkey_configure(c->mqpx, mkey, setters, &conf);
	mlx5dv_wr_set_mkey_access_flags(c->mqpx, access);
	if (layout->interleaved)
		mlx5dv_wr_set_mkey_layout_interleaved(c->mqpx, layout->repeat_count,
						      layout->num_interleaved,
						      layout->interleaved);
	else
		mlx5dv_wr_set_mkey_layout_list(c->mqpx, layout->num_sges, layout->sges);
	if (sig)
		mlx5dv_wr_set_mkey_sig_block(c->mqpx, sig);
	if (crypto)
		mlx5dv_wr_set_mkey_crypto(c->mqpx, crypto);
	rc = ibv_wr_complete(c->qpx);
	if (rc)
		cex_die("mlx5dv_wr_mkey_configure: ibv_wr_complete: %s", strerror(rc));
	wc = wait_wc(c, id, "the MKEY configure WR");
	if (wc.opcode != (enum ibv_wc_opcode)MLX5DV_WC_UMR)
		cex_die("the configure WR completed as opcode %d, not MLX5DV_WC_UMR", wc.opcode);
	printf("configured mkey 0x%08x: %u setters%s%s\n", mkey->lkey, setters,
	       sig ? ", sig_block" : "", crypto ? ", crypto" : "");
}

void cex_configure_wire_dif(struct cex *c, struct mlx5dv_mkey *mkey, uint32_t access,
			    struct ibv_sge *sge, uint16_t bg, uint16_t app, uint32_t ref)
{
	const struct mlx5dv_sig_t10dif dif = {
		.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = bg, .app_tag = app, .ref_tag = ref,
		.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP,
	};
	const struct mlx5dv_sig_block_domain wire = {
		.sig_type = MLX5DV_SIG_TYPE_T10DIF, .sig.dif = &dif,
		.block_size = MLX5DV_BLOCK_SIZE_512,
	};
	const struct mlx5dv_sig_block_attr sig = { .mem = NULL, .wire = &wire, .check_mask = 0xff };

	cex_configure(c, mkey, access, &(struct cex_layout){ .num_sges = 1, .sges = sge }, &sig,
		      NULL);
}

void cex_dif_io_init(struct cex *c, struct cex_dif_io *io, uint32_t len, uint32_t wire_len,
		     uint64_t seed)
{
	io->len = len;
	io->wire_len = wire_len;
	io->mem = cex_alloc(len);
	io->data = cex_alloc(len);
	cex_pattern(io->data, len, seed);
	memcpy(io->mem, io->data, len);
	io->mr = cex_reg_mr(c, io->mem, len);
	io->mkey = cex_create_mkey(c, MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
				   MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1);
	io->sge = (struct ibv_sge){ .addr = (uintptr_t)io->mem, .length = len,
				    .lkey = io->mr->lkey };
}

void cex_dif_io_write(struct cex *c, struct cex_dif_io *io)
{
	struct mlx5dv_mkey_err e;

	cex_image("initiator_memory", io->mem, io->len);
	/* the SGE names the MKEY from 0 and counts the wire's bytes, PIs included */
	cex_rdma_write(c, io->mkey->lkey, 0, io->wire_len, c->peer.rkey, c->peer.addr);
	e = cex_mkey_check(c, "after_write", io->mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "mkey_check after the write finds nothing");
}

void cex_dif_io_read(struct cex *c, struct cex_dif_io *io)
{
	struct mlx5dv_mkey_err e;

	memset(io->mem, 0, io->len);
	cex_rdma_read(c, io->mkey->lkey, 0, io->wire_len, c->peer.rkey, c->peer.addr);
	cex_image("initiator_memory_read", io->mem, io->len);
	cex_check(c, !memcmp(io->mem, io->data, io->len),
		  "the read brought the data back, T10-DIFs checked and stripped");
	e = cex_mkey_check(c, "after_read", io->mkey);
	cex_check(c, e.err_type == MLX5DV_MKEY_NO_ERR, "every T10-DIF the target held was valid");
}

void cex_dif_io_free(struct cex_dif_io *io)
{
	mlx5dv_destroy_mkey(io->mkey);
	ibv_dereg_mr(io->mr);
	free(io->mem);
	free(io->data);
}

struct mlx5dv_dek *cex_create_dek(struct cex *c, const uint8_t *key, size_t key_len)
{
	struct mlx5dv_dek_init_attr a = {};
	struct mlx5dv_dek *dek;

	if (key_len != 32 && key_len != 64)
		cex_die("an AES-XTS key is 32 or 64 bytes, not %zu", key_len);
	a.key_size = key_len == 64 ? MLX5DV_CRYPTO_KEY_SIZE_256 : MLX5DV_CRYPTO_KEY_SIZE_128;
	a.has_keytag = false;
	a.key_purpose = MLX5DV_CRYPTO_KEY_PURPOSE_AES_XTS;
	a.pd = c->pd;
	memcpy(a.key, key, key_len);
	dek = mlx5dv_dek_create(c->ctx, &a);
	if (!dek)
		cex_die("mlx5dv_dek_create (plaintext import): %s", strerror(errno));
	cex_hex_line("key", key, key_len);
	return dek;
}

struct mlx5dv_crypto_attr cex_crypto_attr(struct mlx5dv_dek *dek, bool encrypt_on_tx,
					  enum mlx5dv_signature_crypto_order order,
					  enum mlx5dv_block_size data_unit_size)
{
	static const uint8_t tweak[16] = { 0x00, 0xff, 0xee, 0xdd, 0xcc, 0xbb, 0xaa, 0x99,
					   0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11 };
	struct mlx5dv_crypto_attr a = {
		.crypto_standard = MLX5DV_CRYPTO_STANDARD_AES_XTS,
		.encrypt_on_tx = encrypt_on_tx,
		.signature_crypto_order = order,
		.data_unit_size = data_unit_size,
		.dek = dek,
	};

	memcpy(a.initial_tweak, tweak, sizeof(tweak));
	cex_hex_line("tweak", tweak, sizeof(tweak));
	printf("crypto encrypt_on_tx=%d order=%s data_unit_size=%s\n", encrypt_on_tx,
	       order == MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX ?
	       "SIGNATURE_BEFORE_CRYPTO_ON_TX" : "SIGNATURE_AFTER_CRYPTO_ON_TX",
	       data_unit_size == MLX5DV_BLOCK_SIZE_520 ? "520" : "512");
	return a;
}

static const char *err_name(enum mlx5dv_mkey_err_type t)
{
	switch (t) {
	case MLX5DV_MKEY_NO_ERR:
		return "NO_ERR";
	case MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD:
		return "BAD_GUARD";
	case MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG:
		return "BAD_REFTAG";
	case MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG:
		return "BAD_APPTAG";
	}
	return "UNKNOWN";
}

struct mlx5dv_mkey_err cex_mkey_check(struct cex *c, const char *name, struct mlx5dv_mkey *mkey)
{
	struct mlx5dv_mkey_err e = {};
	int rc = mlx5dv_mkey_check(mkey, &e);

	(void)c;
	if (rc)
		cex_die("mlx5dv_mkey_check: %s", strerror(rc));
	if (e.err_type == MLX5DV_MKEY_NO_ERR)
		printf("mkey_check %s err_type=NO_ERR\n", name);
	else
		printf("mkey_check %s err_type=%s actual=0x%llx expected=0x%llx offset=%llu\n",
		       name, err_name(e.err_type), (unsigned long long)e.err.sig.actual_value,
		       (unsigned long long)e.err.sig.expected_value,
		       (unsigned long long)e.err.sig.offset);
	return e;
}

uint8_t *cex_alloc(size_t len)
{
	size_t rounded = (len + 4095) & ~(size_t)4095;
	uint8_t *p = aligned_alloc(4096, rounded ? rounded : 4096);

	if (!p)
		cex_die("out of memory");
	memset(p, 0, rounded ? rounded : 4096);
	return p;
}

struct ibv_mr *cex_reg_mr(struct cex *c, void *buf, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(c->pd, buf, len, IBV_ACCESS_LOCAL_WRITE |
				       IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);

	if (!mr)
		cex_die("ibv_reg_mr(%zu): %s", len, strerror(errno));
	return mr;
}

void cex_pattern(uint8_t *buf, size_t len, uint64_t seed)
{
	/* xorshift64*: cheap, and the same on both sides for the same seed */
	uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
	size_t i;

	for (i = 0; i < len; i++) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		buf[i] = (uint8_t)((x * 0x2545F4914F6CDD1Dull) >> 56);
	}
}

/* CRC-16/T10-DIF: polynomial 0x8BB7, MSB first, no final xor; the register starts at
 * the seed (mlx5dv_sig_t10dif's bg). */
uint16_t cex_crc16_t10dif(uint16_t seed, const uint8_t *buf, size_t len)
{
	uint16_t crc = seed;
	size_t i;
	int b;

	for (i = 0; i < len; i++) {
		crc ^= (uint16_t)(buf[i] << 8);
		for (b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x8BB7) : (uint16_t)(crc << 1);
	}
	return crc;
}

/* CRC32 as the block signature uses it: polynomial 0x04C11DB7, MSB first, the register
 * starting at the seed, the result inverted. */
uint32_t cex_crc32(uint32_t seed, const uint8_t *buf, size_t len)
{
	uint32_t crc = seed;
	size_t i;
	int b;

	for (i = 0; i < len; i++) {
		crc ^= (uint32_t)buf[i] << 24;
		for (b = 0; b < 8; b++)
			crc = crc & 0x80000000u ? (crc << 1) ^ 0x04C11DB7u : crc << 1;
	}
	return ~crc;
}

uint32_t cex_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

uint16_t cex_be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

void cex_t10dif_pi(uint8_t pi[8], const uint8_t *block, size_t block_len, uint16_t bg,
		   uint16_t app_tag, uint32_t ref_tag)
{
	uint16_t guard = cex_crc16_t10dif(bg, block, block_len);

	pi[0] = guard >> 8;
	pi[1] = guard & 0xff;
	pi[2] = app_tag >> 8;
	pi[3] = app_tag & 0xff;
	pi[4] = ref_tag >> 24;
	pi[5] = (ref_tag >> 16) & 0xff;
	pi[6] = (ref_tag >> 8) & 0xff;
	pi[7] = ref_tag & 0xff;
}

int cex_check_dif(struct cex *c, const char *name, const uint8_t *image, size_t n,
		  size_t block_len, uint16_t bg, uint16_t app_tag, uint32_t ref_tag)
{
	int bad = 0;
	size_t b;

	for (b = 0; b < n; b++) {
		const uint8_t *blk = image + b * (block_len + 8), *pi = blk + block_len;
		uint16_t want = cex_crc16_t10dif(bg, blk, block_len);
		bool ok = cex_be16(pi) == want && cex_be16(pi + 2) == app_tag &&
			  cex_be32(pi + 4) == ref_tag + (uint32_t)b;

		printf("block %s %zu guard=0x%04x app=0x%04x ref=0x%08x %s\n", name, b,
		       cex_be16(pi), cex_be16(pi + 2), cex_be32(pi + 4), ok ? "ok" : "BAD");
		bad += !ok;
	}
	cex_check(c, bad == 0, "%s: %zu T10-DIFs (guard CRC16 seed 0x%04x, app 0x%04x, ref "
		  "0x%x + block) as computed here", name, n, bg, app_tag, ref_tag);
	return bad;
}

void cex_hex_line(const char *what, const uint8_t *buf, size_t len)
{
	size_t i;

	printf("%s ", what);
	for (i = 0; i < len; i++)
		printf("%02x", buf[i]);
	putchar('\n');
}

void cex_image(const char *name, const uint8_t *buf, size_t len)
{
	size_t i;

	printf("image %s %zu ", name, len);
	for (i = 0; i < len; i++)
		printf("%02x", buf[i]);
	putchar('\n');
	fflush(stdout);
}

void cex_check(struct cex *c, bool ok, const char *fmt, ...)
{
	va_list ap;

	printf("check %s: ", ok ? "ok" : "FAILED");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	c->failures += !ok;
}

void cex_close(struct cex *c)
{
	if (c->sock >= 0)
		close(c->sock);
	c->sock = -1;
	if (c->qp && ibv_destroy_qp(c->qp))
		fprintf(stderr, "ibv_destroy_qp: %s\n", strerror(errno));
	if (c->cq && ibv_destroy_cq(c->cq))
		fprintf(stderr, "ibv_destroy_cq: %s\n", strerror(errno));
	if (c->pd && ibv_dealloc_pd(c->pd))
		fprintf(stderr, "ibv_dealloc_pd: %s\n", strerror(errno));
	if (c->ctx && ibv_close_device(c->ctx))
		fprintf(stderr, "ibv_close_device: %s\n", strerror(errno));
	c->qp = NULL;
	c->cq = NULL;
	c->pd = NULL;
	c->ctx = NULL;
}

int cex_finish(struct cex *c)
{
	cex_close(c);
	printf("%s\n", c->failures ? "FAIL" : "PASS");
	return c->failures ? 1 : 0;
}

int cex_main(int argc, char **argv, void (*target)(struct cex *c),
	     void (*initiator)(struct cex *c))
{
	struct cex c;

	cex_args(&c, argc, argv);
	cex_open(&c);
	if (cex_is_target(&c))
		target(&c);
	else
		initiator(&c);
	return cex_finish(&c);
}
