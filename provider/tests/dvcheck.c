/* dvcheck: the mlx5dv calls of a C program, built against Debian's mlx5dv.h and linked
 * with Debian's libmlx5, run under `softhca run` with softhca's libmlx5.so.1
 * (tests/native/test_mlx5dv.py). One QP connected to itself carries the traffic.
 *
 *   dvcheck caps        mlx5dv_is_supported, mlx5dv_open_device, mlx5dv_query_device:
 *                       prints the signature and crypto caps ("caps: NAME VALUE").
 *   dvcheck sig         an MKEY with BLOCK_SIGNATURE configured with access flags,
 *                       layout_list and sig_block (T10-DIF in the memory domain, no
 *                       signature on the wire), then an RDMA WRITE of plain data into it,
 *                       both in one ibv_wr_start..ibv_wr_complete batch; prints the
 *                       memory the MKEY maps ("data: HEX": data and the generated PI,
 *                       which the test checks with its own CRC), then reads the blocks
 *                       back through the MKEY (the PI checked and stripped) and
 *                       mlx5dv_mkey_check.
 *   dvcheck sig-peer PORT [HOST]   the same MKEY on a server (no HOST), written by a
 *                       client's RDMA WRITE through its own daemon (a TCP exchange on
 *                       PORT gives each side the other's QP, GID and the MKEY's rkey).
 *   dvcheck layouts     mlx5dv_wr_mr_interleaved and mlx5dv_wr_mr_list on a QP made for
 *                       them; prints what RDMA READs through the MKEYs bring.
 *   dvcheck bad         the calls that must fail, each with the man page's errno.
 *   dvcheck dek CRED KEY   on a device whose DEKs are imported wrapped: a DEK outside
 *                       a crypto login fails EINVAL; then a login session with the
 *                       wrapped credential CRED (hex) and a DEK of the wrapped KEY (hex),
 *                       a login object and a DEK under it, queried and destroyed.
 *   dvcheck crypto KEY TWEAK   a plaintext DEK of KEY (hex; AES-256-XTS key1||key2) and
 *                       an MKEY with crypto (encrypt on TX, 512-byte data units, initial
 *                       tweak TWEAK (hex)); an RDMA READ through it; prints the plaintext
 *                       ("plain: HEX") and what the READ brought ("cipher: HEX"), which
 *                       the test checks with its own AES-XTS.
 *   dvcheck pipelining  a QP with MLX5DV_QP_CREATE_SIG_PIPELINING moved to SQD with
 *                       en_sqd_async_notify: IBV_EVENT_SQ_DRAINED via
 *                       ibv_get_async_event, then mlx5dv_qp_cancel_posted_send_wrs.
 *   dvcheck absent      without softhca run (no provider): the calls answer unsupported.
 *
 * Each check prints one line, "dvcheck: ok: ..." or "dvcheck: FAIL: ..."; exit 0 when
 * every check holds. Nothing here computes a CRC or a cipher: the test does. */
#include <arpa/inet.h>
#include <infiniband/mlx5dv.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#define PROG "dvcheck"
/* the flags its MRs, QPs and MKEYs were written with: no atomics (side.h's default has them) */
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#include "side.h"

#define BLOCKS 4
#define BLOCK 512
#define PI 8
#define APP_TAG 0x5a5a
#define REF_TAG 0x1000

/* An RC QP made by mlx5dv_create_qp with the MKEY configure builder. */
static struct ibv_qp *dv_qp(struct side *s, uint32_t create_flags)
{
	struct ibv_qp_init_attr_ex qa = {0};
	struct mlx5dv_qp_init_attr dv = {0};

	qa.send_cq = qa.recv_cq = s->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 32;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = 64;
	qa.pd = s->pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ |
			    IBV_QP_EX_WITH_SEND;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MKEY_CONFIGURE;
	if (create_flags) {
		dv.comp_mask |= MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
		dv.create_flags = create_flags;
	}
	return mlx5dv_create_qp(s->ctx, &qa, &dv);
}

/* The QP connected to itself (RTS). */
static void connect_self(struct side *s)
{
	connect_qp(s, &(struct peer_info){.qpn = s->qp->qp_num, .gid = s->gid});
}

static void open_dv_side(struct side *s, uint32_t create_flags)
{
	open_ctx(s);
	s->qp = dv_qp(s, create_flags);
	if (!s->qp)
		die("mlx5dv_create_qp");
	s->qpx = ibv_qp_to_qp_ex(s->qp);
	s->mqp = mlx5dv_qp_ex_from_ibv_qp_ex(s->qpx);
	if (!s->mqp)
		die("mlx5dv_qp_ex_from_ibv_qp_ex");
	connect_self(s);
}

static void print_hex(const char *label, const uint8_t *p, size_t n)
{
	size_t i;

	printf("%s: ", label);
	for (i = 0; i < n; i++)
		printf("%02x", p[i]);
	printf("\n");
}

static size_t from_hex(const char *h, uint8_t *out, size_t max)
{
	size_t n = strlen(h) / 2, i;
	unsigned v;

	if (n > max)
		die("hex argument too long");
	for (i = 0; i < n; i++) {
		if (sscanf(h + 2 * i, "%2x", &v) != 1)
			die("hex argument");
		out[i] = (uint8_t)v;
	}
	return n;
}

static struct mlx5dv_mkey *new_mkey(struct side *s, uint32_t flags)
{
	struct mlx5dv_mkey_init_attr ma = {.pd = s->pd, .max_entries = 1,
					   .create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | flags};
	struct mlx5dv_mkey *mk = mlx5dv_create_mkey(&ma);

	if (!mk)
		die("mlx5dv_create_mkey");
	return mk;
}

/* -- caps -------------------------------------------------------------------------------- */

static int caps(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct mlx5dv_context_attr ca = {0};
	struct mlx5dv_context dc = {0};
	struct ibv_context *ctx;
	int rc;

	if (!list || !list[0])
		die("no device");
	CHECK(mlx5dv_is_supported(list[0]), "mlx5dv_is_supported(%s) is true",
	      ibv_get_device_name(list[0]));
	ctx = mlx5dv_open_device(list[0], &ca);
	CHECK(ctx != NULL, "mlx5dv_open_device opens %s", ibv_get_device_name(list[0]));
	ibv_free_device_list(list);
	if (!ctx)
		return 1;
	dc.comp_mask = MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD | MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD |
		       MLX5DV_CONTEXT_MASK_STRIDING_RQ;
	rc = mlx5dv_query_device(ctx, &dc);
	CHECK(rc == 0, "mlx5dv_query_device returns %d", rc);
	printf("caps: comp_mask %llu\n", (unsigned long long)dc.comp_mask);
	printf("caps: sig_caps.block_size %llu\n", (unsigned long long)dc.sig_caps.block_size);
	printf("caps: sig_caps.block_prot %u\n", dc.sig_caps.block_prot);
	printf("caps: sig_caps.t10dif_bg %u\n", dc.sig_caps.t10dif_bg);
	printf("caps: sig_caps.crc_type %u\n", dc.sig_caps.crc_type);
	printf("caps: crypto_caps.crypto_engines %u\n", dc.crypto_caps.crypto_engines);
	printf("caps: crypto_caps.wrapped_import_method %u\n",
	       dc.crypto_caps.wrapped_import_method);
	printf("caps: crypto_caps.flags %u\n", dc.crypto_caps.flags);
	printf("caps: crypto_caps.failed_selftests %u\n", dc.crypto_caps.failed_selftests);
	ibv_close_device(ctx);
	return failures ? 1 : 0;
}

/* -- sig --------------------------------------------------------------------------------- */

static int sig(void)
{
	struct side s = {0};
	struct mlx5dv_sig_t10dif dif = {.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = 0,
					.app_tag = APP_TAG, .ref_tag = REF_TAG,
					.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP};
	struct mlx5dv_sig_block_domain mem = {.sig_type = MLX5DV_SIG_TYPE_T10DIF,
					      .sig.dif = &dif,
					      .block_size = MLX5DV_BLOCK_SIZE_512};
	struct mlx5dv_sig_block_attr sa = {.mem = &mem, .wire = NULL,
					   .check_mask = MLX5DV_SIG_MASK_T10DIF_GUARD |
							 MLX5DV_SIG_MASK_T10DIF_APPTAG |
							 MLX5DV_SIG_MASK_T10DIF_REFTAG};
	struct mlx5dv_mkey_conf_attr conf = {0};
	struct mlx5dv_mkey_err err;
	struct mlx5dv_mkey *mk;
	struct ibv_mr *src_mr, *dst_mr, *back_mr;
	struct ibv_sge layout;
	struct ibv_wc wc;
	uint8_t *src, *dst, *back;
	size_t i;
	int rc, bad = 0;

	open_dv_side(&s, 0);
	src = malloc(BLOCKS * BLOCK);
	dst = calloc(1, BLOCKS * (BLOCK + PI));
	back = calloc(1, BLOCKS * BLOCK);
	if (!src || !dst || !back)
		die("malloc");
	for (i = 0; i < BLOCKS * BLOCK; i++)
		src[i] = (uint8_t)(i * 7 + (i >> 9) * 13 + 1);
	src_mr = ibv_reg_mr(s.pd, src, BLOCKS * BLOCK, ACCESS);
	dst_mr = ibv_reg_mr(s.pd, dst, BLOCKS * (BLOCK + PI), ACCESS);
	back_mr = ibv_reg_mr(s.pd, back, BLOCKS * BLOCK, ACCESS);
	if (!src_mr || !dst_mr || !back_mr)
		die("ibv_reg_mr");
	mk = new_mkey(&s, MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE);
	CHECK(mk->lkey == mk->rkey && mk->lkey != 0, "mlx5dv_create_mkey: lkey %#x rkey %#x",
	      mk->lkey, mk->rkey);
	layout = (struct ibv_sge){.addr = (uintptr_t)dst, .length = BLOCKS * (BLOCK + PI),
				  .lkey = dst_mr->lkey};

	/* one batch: the configure WR, then an RDMA WRITE through the MKEY it configured
	 * (the MKEY is zero-based: remote address 0 is its first byte) */
	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 1;
	s.qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	mlx5dv_wr_mkey_configure(s.mqp, mk, 3, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
	mlx5dv_wr_set_mkey_sig_block(s.mqp, &sa);
	s.qpx->wr_id = 2;
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(s.qpx, mk->rkey, 0);
	ibv_wr_set_sge(s.qpx, src_mr->lkey, (uintptr_t)src, BLOCKS * BLOCK);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "ibv_wr_complete of configure + RDMA WRITE: %s", strerror(rc));
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 &&
	      wc.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR,
	      "the configure WR completes first: wr_id %llu opcode %d (MLX5DV_WC_UMR %d) %s",
	      (unsigned long long)wc.wr_id, wc.opcode, MLX5DV_WC_UMR,
	      ibv_wc_status_str(wc.status));
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 2 && wc.opcode == IBV_WC_RDMA_WRITE,
	      "the RDMA WRITE through the MKEY completes: wr_id %llu %s",
	      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	print_hex("data", dst, BLOCKS * (BLOCK + PI));

	/* read the blocks back through the MKEY: the PI is checked and stripped */
	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 3;
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(s.qpx, mk->rkey, 0);
	ibv_wr_set_sge(s.qpx, back_mr->lkey, (uintptr_t)back, BLOCKS * BLOCK);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "ibv_wr_complete of an RDMA READ through the MKEY: %s", strerror(rc));
	wc = wait_wc(&s);
	for (i = 0; i < BLOCKS * BLOCK; i++)
		bad += back[i] != src[i];
	CHECK(wc.status == IBV_WC_SUCCESS && bad == 0,
	      "the RDMA READ through the MKEY brings the data without PI: %s, %d bytes differ",
	      ibv_wc_status_str(wc.status), bad);
	memset(&err, 0xff, sizeof(err));
	rc = mlx5dv_mkey_check(mk, &err);
	CHECK(rc == 0 && err.err_type == MLX5DV_MKEY_NO_ERR,
	      "mlx5dv_mkey_check: %d, err_type %d (MLX5DV_MKEY_NO_ERR)", rc, err.err_type);
	rc = mlx5dv_destroy_mkey(mk);
	CHECK(rc == 0, "mlx5dv_destroy_mkey: %d", rc);
	return failures ? 1 : 0;
}

/* -- sig against a peer ---------------------------------------------------------------------- */

/* The server's side of the exchange: listens on port, returns the connected socket. */
static int tcp_server(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0), c;

	if (fd < 0)
		die("socket");
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1))
		die("bind/listen");
	c = accept(fd, NULL, NULL);
	if (c < 0)
		die("accept");
	close(fd);
	return c;
}

static int tcp_client(const char *host, int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || inet_pton(AF_INET, host, &a.sin_addr) != 1)
		die("socket/address");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)))
		die("connect");
	return fd;
}

static void xfer(int fd, void *p, size_t n, int out)
{
	ssize_t r = out ? write(fd, p, n) : recv(fd, p, n, MSG_WAITALL);

	if (r != (ssize_t)n)
		die("tcp exchange");
}

/* dvcheck sig-peer PORT [HOST]: the server (no HOST) configures a T10-DIF MKEY over its
 * memory and hands its rkey to the client, whose RDMA WRITE of plain blocks crosses the
 * two daemons into it; the server then prints its memory ("data: HEX") and checks the
 * MKEY. The client's QP is a plain RC QP of Debian's verbs. */
static int sig_peer(int port, const char *host)
{
	struct side s = {0};
	struct peer_info me, peer;
	struct ibv_wc wc;
	struct ibv_mr *mr;
	uint8_t *buf, done = 1;
	size_t i, n = host ? BLOCKS * BLOCK : BLOCKS * (BLOCK + PI);
	int fd, rc;

	open_ctx(&s);
	s.qp = dv_qp(&s, 0);
	if (!s.qp)
		die("mlx5dv_create_qp");
	s.qpx = ibv_qp_to_qp_ex(s.qp);
	s.mqp = mlx5dv_qp_ex_from_ibv_qp_ex(s.qpx);
	buf = calloc(1, n);
	if (!buf || !s.mqp)
		die("setup");
	for (i = 0; host && i < n; i++)
		buf[i] = (uint8_t)(i * 7 + (i >> 9) * 13 + 1);
	mr = ibv_reg_mr(s.pd, buf, n, ACCESS);
	if (!mr)
		die("ibv_reg_mr");
	me = (struct peer_info){.qpn = s.qp->qp_num, .gid = s.gid};
	if (host) {
		fd = tcp_client(host, port);
		xfer(fd, &peer, sizeof(peer), 0);
		xfer(fd, &me, sizeof(me), 1);
		connect_qp(&s, &peer);
		xfer(fd, &done, 1, 0);          /* the server's QP is ready too */
		ibv_wr_start(s.qpx);
		s.qpx->wr_id = 9;
		s.qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(s.qpx, peer.rkey, 0);
		ibv_wr_set_sge(s.qpx, mr->lkey, (uintptr_t)buf, (uint32_t)n);
		rc = ibv_wr_complete(s.qpx);
		CHECK(rc == 0, "client: ibv_wr_complete of the RDMA WRITE: %s", strerror(rc));
		wc = wait_wc(&s);
		CHECK(wc.status == IBV_WC_SUCCESS, "client: the RDMA WRITE into the peer's MKEY "
		      "completes: %s", ibv_wc_status_str(wc.status));
		xfer(fd, &done, 1, 1);
	} else {
		struct mlx5dv_sig_t10dif dif = {.bg_type = MLX5DV_SIG_T10DIF_CRC, .bg = 0,
						.app_tag = APP_TAG, .ref_tag = REF_TAG,
						.flags = MLX5DV_SIG_T10DIF_FLAG_REF_REMAP};
		struct mlx5dv_sig_block_domain mem = {.sig_type = MLX5DV_SIG_TYPE_T10DIF,
						      .sig.dif = &dif,
						      .block_size = MLX5DV_BLOCK_SIZE_512};
		struct mlx5dv_sig_block_attr sa = {.mem = &mem};
		struct mlx5dv_mkey_conf_attr conf = {0};
		struct mlx5dv_mkey_err err;
		struct mlx5dv_mkey *mk = new_mkey(&s, MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE);
		struct ibv_sge layout = {.addr = (uintptr_t)buf, .length = (uint32_t)n,
					 .lkey = mr->lkey};

		/* the configure WR needs an RTS QP: the peer's address first */
		fd = tcp_server(port);
		me.rkey = mk->rkey;
		xfer(fd, &me, sizeof(me), 1);
		xfer(fd, &peer, sizeof(peer), 0);
		connect_qp(&s, &peer);
		ibv_wr_start(s.qpx);
		s.qpx->wr_id = 1;
		s.qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
		mlx5dv_wr_mkey_configure(s.mqp, mk, 3, &conf);
		mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
		mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
		mlx5dv_wr_set_mkey_sig_block(s.mqp, &sa);
		rc = ibv_wr_complete(s.qpx);
		CHECK(rc == 0, "server: ibv_wr_complete of the configure: %s", strerror(rc));
		wc = wait_wc(&s);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR,
		      "server: the configure completes: %s", ibv_wc_status_str(wc.status));
		xfer(fd, &done, 1, 1);
		xfer(fd, &done, 1, 0);          /* the client's WRITE completed */
		print_hex("data", buf, n);
		memset(&err, 0xff, sizeof(err));
		rc = mlx5dv_mkey_check(mk, &err);
		CHECK(rc == 0 && err.err_type == MLX5DV_MKEY_NO_ERR,
		      "server: mlx5dv_mkey_check: %d, err_type %d (MLX5DV_MKEY_NO_ERR)", rc,
		      err.err_type);
	}
	close(fd);
	return failures ? 1 : 0;
}

/* -- the older layout builders ----------------------------------------------------------------- */

/* dvcheck layouts: on a QP created with MLX5DV_QP_EX_WITH_MR_INTERLEAVED and _MR_LIST
 * (not _MKEY_CONFIGURE), mlx5dv_wr_mr_interleaved and mlx5dv_wr_mr_list register
 * layouts over a patterned buffer; an RDMA READ through each MKEY brings what the
 * layout maps ("interleaved: HEX", "list: HEX"; the test computes them from the man
 * page). mlx5dv_wr_mkey_configure on that QP is EOPNOTSUPP. */
static int layouts(void)
{
	struct side s = {0};
	struct ibv_qp_init_attr_ex qa = {0};
	struct mlx5dv_qp_init_attr dv = {0};
	struct mlx5dv_mkey_conf_attr conf = {0};
	struct mlx5dv_mr_interleaved il[2];
	struct ibv_sge list[2];
	struct mlx5dv_mkey *mki, *mkl;
	struct mlx5dv_mkey_init_attr ma = {0};
	struct ibv_mr *mr, *out_mr;
	struct ibv_wc wc;
	uint8_t *buf, *out;
	size_t i;
	int rc;

	open_ctx(&s);
	qa.send_cq = qa.recv_cq = s.cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 32;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.pd = s.pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_MR_INTERLEAVED | MLX5DV_QP_EX_WITH_MR_LIST;
	s.qp = mlx5dv_create_qp(s.ctx, &qa, &dv);
	if (!s.qp)
		die("mlx5dv_create_qp");
	s.qpx = ibv_qp_to_qp_ex(s.qp);
	s.mqp = mlx5dv_qp_ex_from_ibv_qp_ex(s.qpx);
	connect_self(&s);
	buf = malloc(4096);
	out = calloc(1, 4096);
	if (!buf || !out)
		die("malloc");
	for (i = 0; i < 4096; i++)
		buf[i] = (uint8_t)(i * 5 + 3);
	mr = ibv_reg_mr(s.pd, buf, 4096, ACCESS);
	out_mr = ibv_reg_mr(s.pd, out, 4096, ACCESS);
	if (!mr || !out_mr)
		die("ibv_reg_mr");
	ma.pd = s.pd;
	ma.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
	ma.max_entries = 3;         /* two entries and the strided header */
	mki = mlx5dv_create_mkey(&ma);
	ma.max_entries = 2;
	mkl = mlx5dv_create_mkey(&ma);
	if (!mki || !mkl)
		die("mlx5dv_create_mkey");
	il[0] = (struct mlx5dv_mr_interleaved){.addr = (uintptr_t)buf, .bytes_count = 16,
					       .bytes_skip = 48, .lkey = mr->lkey};
	il[1] = (struct mlx5dv_mr_interleaved){.addr = (uintptr_t)buf + 1000, .bytes_count = 8,
					       .bytes_skip = 8, .lkey = mr->lkey};
	list[0] = (struct ibv_sge){.addr = (uintptr_t)buf + 100, .length = 50, .lkey = mr->lkey};
	list[1] = (struct ibv_sge){.addr = (uintptr_t)buf + 3000, .length = 30, .lkey = mr->lkey};

	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 1;
	s.qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	mlx5dv_wr_mr_interleaved(s.mqp, mki, ACCESS, 3, 2, il);
	s.qpx->wr_id = 2;
	mlx5dv_wr_mr_list(s.mqp, mkl, ACCESS, 2, list);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "mlx5dv_wr_mr_interleaved and mlx5dv_wr_mr_list: ibv_wr_complete %s",
	      strerror(rc));
	for (i = 1; i <= 2; i++) {
		wc = wait_wc(&s);
		CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == i &&
		      wc.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR,
		      "registration %zu completes with MLX5DV_WC_UMR: %s", i,
		      ibv_wc_status_str(wc.status));
	}
	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 3;
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(s.qpx, mki->rkey, 0);
	ibv_wr_set_sge(s.qpx, out_mr->lkey, (uintptr_t)out, 72);
	s.qpx->wr_id = 4;
	ibv_wr_rdma_read(s.qpx, mkl->rkey, 0);
	ibv_wr_set_sge(s.qpx, out_mr->lkey, (uintptr_t)out + 1024, 80);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "two RDMA READs through the MKEYs: ibv_wr_complete %s", strerror(rc));
	for (i = 0; i < 2; i++) {
		wc = wait_wc(&s);
		CHECK(wc.status == IBV_WC_SUCCESS, "RDMA READ %llu completes: %s",
		      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	}
	print_hex("interleaved", out, 72);
	print_hex("list", out + 1024, 80);

	ibv_wr_start(s.qpx);
	s.qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mkey_configure(s.mqp, mkl, 1, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_wr_mkey_configure on a QP without "
	      "MLX5DV_QP_EX_WITH_MKEY_CONFIGURE: ibv_wr_complete %s", strerror(rc));
	return failures ? 1 : 0;
}

/* -- bad input ----------------------------------------------------------------------------- */

static int bad(void)
{
	struct side s = {0};
	struct mlx5dv_mkey_conf_attr conf = {0};
	struct mlx5dv_mkey_err err;
	struct mlx5dv_mkey *plain, *sigk;
	struct mlx5dv_flow_matcher_attr fm = {0};
	struct mlx5dv_qp_init_attr dv = {0};
	struct ibv_qp_init_attr_ex qa = {0};
	struct ibv_mr *mr;
	struct ibv_sge layout;
	uint8_t *buf;
	void *p;
	int rc;

	open_dv_side(&s, 0);
	buf = calloc(1, 8192);
	mr = ibv_reg_mr(s.pd, buf, 8192, ACCESS);
	if (!buf || !mr)
		die("ibv_reg_mr");
	layout = (struct ibv_sge){.addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey};
	plain = new_mkey(&s, 0);
	sigk = new_mkey(&s, MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE);

	/* mlx5dv_wr_mkey_configure(3): num_setters announces the setters that follow */
	ibv_wr_start(s.qpx);
	s.qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	mlx5dv_wr_mkey_configure(s.mqp, plain, 3, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == EINVAL, "3 setters announced, 2 called: ibv_wr_complete fails %s",
	      strerror(rc));

	ibv_wr_start(s.qpx);
	s.qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mkey_configure(s.mqp, plain, 1, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == EINVAL, "1 setter announced, 2 called: ibv_wr_complete fails %s",
	      strerror(rc));

	ibv_wr_start(s.qpx);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == EINVAL, "a setter with no configure: ibv_wr_complete fails %s",
	      strerror(rc));

	/* an RDMA WRITE before the failing configure is not posted either: the batch's
	 * structure is checked before any of it is */
	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 77;
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(s.qpx, mr->rkey, (uintptr_t)buf + 4096);
	ibv_wr_set_sge(s.qpx, mr->lkey, (uintptr_t)buf, 64);
	s.qpx->wr_flags = IBV_SEND_INLINE;
	mlx5dv_wr_mkey_configure(s.mqp, plain, 2, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	rc = ibv_wr_complete(s.qpx);
	{
		struct ibv_wc wc;
		int n;

		usleep(200000);
		n = ibv_poll_cq(s.cq, 1, &wc);
		CHECK(rc == EINVAL && n == 0, "RDMA WRITE + a configure missing a setter: "
		      "ibv_wr_complete fails %s and nothing completes (%d)", strerror(rc), n);
	}

	/* the sig_block setter on an MKEY created without BLOCK_SIGNATURE (the daemon's
	 * check, mlx5dv_wr_set_mkey_sig_block(3)) */
	{
		struct mlx5dv_sig_t10dif dif = {.bg_type = MLX5DV_SIG_T10DIF_CRC};
		struct mlx5dv_sig_block_domain d = {.sig_type = MLX5DV_SIG_TYPE_T10DIF,
						    .sig.dif = &dif,
						    .block_size = MLX5DV_BLOCK_SIZE_512};
		struct mlx5dv_sig_block_attr sa = {.mem = &d};

		ibv_wr_start(s.qpx);
		s.qpx->wr_flags = IBV_SEND_INLINE;
		mlx5dv_wr_mkey_configure(s.mqp, plain, 2, &conf);
		mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
		mlx5dv_wr_set_mkey_sig_block(s.mqp, &sa);
		rc = ibv_wr_complete(s.qpx);
		CHECK(rc == EINVAL, "sig_block on an MKEY without BLOCK_SIGNATURE: "
		      "ibv_wr_complete fails %s", strerror(rc));
	}

	/* the caveat of a mixed batch (docs/native.md): a run the daemon refuses (the
	 * sig_block of an MKEY without BLOCK_SIGNATURE) fails ibv_wr_complete, and the run
	 * of send WRs before it stays posted */
	{
		struct mlx5dv_sig_t10dif dif = {.bg_type = MLX5DV_SIG_T10DIF_CRC};
		struct mlx5dv_sig_block_domain d = {.sig_type = MLX5DV_SIG_TYPE_T10DIF,
						    .sig.dif = &dif,
						    .block_size = MLX5DV_BLOCK_SIZE_512};
		struct mlx5dv_sig_block_attr sa = {.mem = &d};
		struct ibv_wc wc;

		ibv_wr_start(s.qpx);
		s.qpx->wr_id = 55;
		s.qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(s.qpx, mr->rkey, (uintptr_t)buf + 4096);
		ibv_wr_set_sge(s.qpx, mr->lkey, (uintptr_t)buf, 64);
		s.qpx->wr_flags = IBV_SEND_INLINE;
		mlx5dv_wr_mkey_configure(s.mqp, plain, 1, &conf);
		mlx5dv_wr_set_mkey_sig_block(s.mqp, &sa);
		rc = ibv_wr_complete(s.qpx);
		wc = wait_wc(&s);
		CHECK(rc == EINVAL && wc.wr_id == 55 && wc.status == IBV_WC_SUCCESS,
		      "RDMA WRITE + a configure the daemon refuses: ibv_wr_complete fails %s, the "
		      "WRITE before it completes (wr_id %llu, %s)", strerror(rc),
		      (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	}

	/* DC is not modelled: the builder's error is the batch's */
	ibv_wr_start(s.qpx);
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(s.qpx);
	mlx5dv_wr_set_dc_addr(s.mqp, NULL, 1, 0);
	ibv_wr_set_sge(s.qpx, mr->lkey, (uintptr_t)buf, 64);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_wr_set_dc_addr: ibv_wr_complete fails %s",
	      strerror(rc));

	rc = mlx5dv_mkey_check(plain, &err);
	CHECK(rc == EINVAL, "mlx5dv_mkey_check of an MKEY without BLOCK_SIGNATURE: %s",
	      strerror(rc));
	rc = mlx5dv_mkey_check(sigk, &err);
	CHECK(rc == 0 && err.err_type == MLX5DV_MKEY_NO_ERR,
	      "mlx5dv_mkey_check of an unconfigured MKEY with BLOCK_SIGNATURE: %d, NO_ERR", rc);

	errno = 0;
	p = mlx5dv_create_flow_matcher(s.ctx, &fm);
	CHECK(p == NULL && errno == EOPNOTSUPP, "mlx5dv_create_flow_matcher: NULL, errno %s",
	      strerror(errno));
	rc = mlx5dv_init_obj(NULL, MLX5DV_OBJ_QP);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_init_obj: %s", strerror(rc));

	qa.send_cq = qa.recv_cq = s.cq;
	qa.qp_type = IBV_QPT_DRIVER;
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
	qa.pd = s.pd;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
	dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
	errno = 0;
	p = mlx5dv_create_qp(s.ctx, &qa, &dv);
	CHECK(p == NULL && errno == EOPNOTSUPP, "mlx5dv_create_qp of a DCI: NULL, errno %s",
	      strerror(errno));
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS;
	dv.send_ops_flags = MLX5DV_QP_EX_WITH_RAW_WQE;
	qa.qp_type = IBV_QPT_RC;
	qa.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	errno = 0;
	p = mlx5dv_create_qp(s.ctx, &qa, &dv);
	CHECK(p == NULL && errno == EOPNOTSUPP,
	      "mlx5dv_create_qp with MLX5DV_QP_EX_WITH_RAW_WQE: NULL, errno %s", strerror(errno));

	/* the limit of one mkey_configure request: 2048 calls in a row; one more is
	 * refused with ENOMEM, as more send WRs than one post takes are */
	{
		int i;

		ibv_wr_start(s.qpx);
		s.qpx->wr_flags = IBV_SEND_INLINE;
		for (i = 0; i < 1024; i++) {
			mlx5dv_wr_mkey_configure(s.mqp, plain, 1, &conf);
			mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
		}
		mlx5dv_wr_mkey_configure(s.mqp, plain, 0, &conf);
		rc = ibv_wr_complete(s.qpx);
		CHECK(rc == ENOMEM, "2049 MKEY configure calls in one batch: ibv_wr_complete %s",
		      strerror(rc));
	}

	CHECK(mlx5dv_destroy_mkey(plain) == 0 && mlx5dv_destroy_mkey(sigk) == 0,
	      "the MKEYs are destroyed");
	return failures ? 1 : 0;
}

/* -- no provider ------------------------------------------------------------------------------ */

/* Run without `softhca run` (no provider loaded, no device): every call answers as on a
 * device libmlx5 does not support, and nothing is dereferenced. */
static int absent(void)
{
	struct mlx5dv_mkey_init_attr ma = {0};
	struct mlx5dv_crypto_login_attr la = {0};
	struct mlx5dv_context dc = {0};
	enum mlx5dv_crypto_login_state st;
	void *p;
	int rc;

	CHECK(!mlx5dv_is_supported(NULL), "mlx5dv_is_supported is false");
	rc = mlx5dv_query_device(NULL, &dc);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_query_device: %s", strerror(rc));
	errno = 0;
	p = mlx5dv_create_mkey(&ma);
	CHECK(p == NULL && errno == EOPNOTSUPP, "mlx5dv_create_mkey: NULL, errno %s",
	      strerror(errno));
	errno = 0;
	p = mlx5dv_qp_ex_from_ibv_qp_ex(NULL);
	CHECK(p == NULL && errno == EOPNOTSUPP, "mlx5dv_qp_ex_from_ibv_qp_ex: NULL, errno %s",
	      strerror(errno));
	rc = mlx5dv_crypto_login(NULL, &la);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_crypto_login: %s", strerror(rc));
	rc = mlx5dv_crypto_login_query_state(NULL, &st);
	CHECK(rc == EOPNOTSUPP, "mlx5dv_crypto_login_query_state: %s", strerror(rc));
	rc = mlx5dv_qp_cancel_posted_send_wrs(NULL, 1);
	CHECK(rc == -EOPNOTSUPP, "mlx5dv_qp_cancel_posted_send_wrs: %d (-EOPNOTSUPP)", rc);
	errno = 0;
	rc = (int)mlx5dv_devx_get_event(NULL, NULL, 0);
	CHECK(rc == -1 && errno == EOPNOTSUPP, "mlx5dv_devx_get_event: -1, errno %s",
	      strerror(errno));
	return failures ? 1 : 0;
}

/* -- DEKs and crypto login -------------------------------------------------------------------- */

static int dek(const char *cred_hex, const char *key_hex)
{
	struct side s = {0};
	struct mlx5dv_crypto_login_attr la = {0};
	struct mlx5dv_crypto_login_attr_ex lx = {0};
	struct mlx5dv_crypto_login_query_attr lq = {0};
	struct mlx5dv_dek_init_attr da = {0};
	struct mlx5dv_dek_attr dq = {0};
	enum mlx5dv_crypto_login_state st = MLX5DV_CRYPTO_LOGIN_STATE_INVALID;
	struct mlx5dv_crypto_login_obj *lo;
	struct mlx5dv_dek *d;
	uint8_t cred[48];
	int rc;

	open_ctx(&s);
	if (from_hex(cred_hex, cred, sizeof(cred)) != sizeof(cred))
		die("the credential is 48 bytes");
	da.key_size = MLX5DV_CRYPTO_KEY_SIZE_256;
	da.key_purpose = MLX5DV_CRYPTO_KEY_PURPOSE_AES_XTS;
	da.pd = s.pd;
	memcpy(da.opaque, "dvcheck!", 8);
	if (from_hex(key_hex, (uint8_t *)da.key, sizeof(da.key)) != 72)
		die("the wrapped AES-256-XTS key is 72 bytes");

	rc = mlx5dv_crypto_login_query_state(s.ctx, &st);
	CHECK(rc == 0 && st == MLX5DV_CRYPTO_LOGIN_STATE_NO_LOGIN,
	      "before a login: state %d (NO_LOGIN)", st);
	errno = 0;
	d = mlx5dv_dek_create(s.ctx, &da);
	CHECK(d == NULL && errno == EINVAL,
	      "mlx5dv_dek_create outside a crypto login on a wrapped-import device: NULL, %s",
	      strerror(errno));

	memcpy(la.credential, cred, sizeof(cred));
	la.import_kek_id = 0;
	la.credential_id = 0;
	rc = mlx5dv_crypto_login(s.ctx, &la);
	CHECK(rc == 0, "mlx5dv_crypto_login: %s", strerror(rc));
	rc = mlx5dv_crypto_login(s.ctx, &la);
	CHECK(rc == EEXIST, "a second mlx5dv_crypto_login: %s", strerror(rc));
	rc = mlx5dv_crypto_login_query_state(s.ctx, &st);
	CHECK(rc == 0 && st == MLX5DV_CRYPTO_LOGIN_STATE_VALID, "in the session: state %d "
	      "(VALID)", st);
	d = mlx5dv_dek_create(s.ctx, &da);
	CHECK(d != NULL, "mlx5dv_dek_create in the session: %s", d ? "a DEK" : strerror(errno));
	if (d) {
		rc = mlx5dv_dek_query(d, &dq);
		CHECK(rc == 0 && dq.state == MLX5DV_DEK_STATE_READY &&
		      memcmp(dq.opaque, "dvcheck!", 8) == 0,
		      "mlx5dv_dek_query: %d, state %d (READY), opaque %.8s", rc, dq.state,
		      dq.opaque);
		CHECK(mlx5dv_dek_destroy(d) == 0, "mlx5dv_dek_destroy");
	}
	rc = mlx5dv_crypto_logout(s.ctx);
	CHECK(rc == 0, "mlx5dv_crypto_logout: %s", strerror(rc));
	rc = mlx5dv_crypto_logout(s.ctx);
	CHECK(rc == ENOENT, "mlx5dv_crypto_logout with no session: %s", strerror(rc));

	lx.credential = cred;
	lx.credential_len = sizeof(cred);
	lo = mlx5dv_crypto_login_create(s.ctx, &lx);
	CHECK(lo != NULL, "mlx5dv_crypto_login_create: %s", lo ? "an object" : strerror(errno));
	if (!lo)
		return 1;
	rc = mlx5dv_crypto_login_query(lo, &lq);
	CHECK(rc == 0 && lq.state == MLX5DV_CRYPTO_LOGIN_STATE_VALID,
	      "mlx5dv_crypto_login_query: %d, state %d (VALID)", rc, lq.state);
	da.comp_mask = MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN;
	da.crypto_login = lo;
	d = mlx5dv_dek_create(s.ctx, &da);
	CHECK(d != NULL, "mlx5dv_dek_create with the login object: %s",
	      d ? "a DEK" : strerror(errno));
	if (d)
		CHECK(mlx5dv_dek_destroy(d) == 0, "mlx5dv_dek_destroy");
	da.key[5] ^= 1;     /* a key that does not unwrap under the import KEK */
	errno = 0;
	d = mlx5dv_dek_create(s.ctx, &da);
	CHECK(d == NULL && errno == EINVAL, "mlx5dv_dek_create of a damaged wrapped key: %s",
	      strerror(errno));
	rc = mlx5dv_crypto_login_destroy(lo);
	CHECK(rc == 0, "mlx5dv_crypto_login_destroy: %s", strerror(rc));
	return failures ? 1 : 0;
}

/* -- crypto through an MKEY ------------------------------------------------------------------- */

static int crypto(const char *key_hex, const char *tweak_hex)
{
	struct side s = {0};
	struct mlx5dv_dek_init_attr da = {0};
	struct mlx5dv_crypto_attr ca = {0};
	struct mlx5dv_mkey_conf_attr conf = {0};
	struct mlx5dv_mkey *mk;
	struct mlx5dv_dek *d;
	struct ibv_mr *mr, *out_mr;
	struct ibv_sge layout;
	struct ibv_wc wc;
	uint8_t *plain, *out;
	size_t i;
	int rc;

	open_dv_side(&s, 0);
	da.key_size = MLX5DV_CRYPTO_KEY_SIZE_256;
	da.key_purpose = MLX5DV_CRYPTO_KEY_PURPOSE_AES_XTS;
	da.pd = s.pd;
	if (from_hex(key_hex, (uint8_t *)da.key, sizeof(da.key)) != 64)
		die("the plaintext AES-256-XTS key is 64 bytes");
	d = mlx5dv_dek_create(s.ctx, &da);
	if (!d)
		die("mlx5dv_dek_create");
	if (from_hex(tweak_hex, (uint8_t *)ca.initial_tweak, 16) != 16)
		die("the tweak is 16 bytes");
	plain = malloc(BLOCKS * BLOCK);
	out = calloc(1, BLOCKS * BLOCK);
	if (!plain || !out)
		die("malloc");
	for (i = 0; i < BLOCKS * BLOCK; i++)
		plain[i] = (uint8_t)(i * 3 + 11);
	mr = ibv_reg_mr(s.pd, plain, BLOCKS * BLOCK, ACCESS);
	out_mr = ibv_reg_mr(s.pd, out, BLOCKS * BLOCK, ACCESS);
	if (!mr || !out_mr)
		die("ibv_reg_mr");
	mk = new_mkey(&s, MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO);
	layout = (struct ibv_sge){.addr = (uintptr_t)plain, .length = BLOCKS * BLOCK,
				  .lkey = mr->lkey};
	ca.crypto_standard = MLX5DV_CRYPTO_STANDARD_AES_XTS;
	ca.encrypt_on_tx = true;
	ca.signature_crypto_order = MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_AFTER_CRYPTO_ON_TX;
	ca.data_unit_size = MLX5DV_BLOCK_SIZE_512;
	ca.dek = d;

	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 1;
	s.qpx->wr_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
	mlx5dv_wr_mkey_configure(s.mqp, mk, 3, &conf);
	mlx5dv_wr_set_mkey_access_flags(s.mqp, ACCESS);
	mlx5dv_wr_set_mkey_layout_list(s.mqp, 1, &layout);
	mlx5dv_wr_set_mkey_crypto(s.mqp, &ca);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "ibv_wr_complete of the crypto configure: %s", strerror(rc));
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR,
	      "the configure completes: %s", ibv_wc_status_str(wc.status));

	ibv_wr_start(s.qpx);
	s.qpx->wr_id = 2;
	s.qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(s.qpx, mk->rkey, 0);
	ibv_wr_set_sge(s.qpx, out_mr->lkey, (uintptr_t)out, BLOCKS * BLOCK);
	rc = ibv_wr_complete(s.qpx);
	CHECK(rc == 0, "ibv_wr_complete of an RDMA READ through the MKEY: %s", strerror(rc));
	wc = wait_wc(&s);
	CHECK(wc.status == IBV_WC_SUCCESS, "the RDMA READ completes: %s",
	      ibv_wc_status_str(wc.status));
	print_hex("plain", plain, BLOCKS * BLOCK);
	print_hex("cipher", out, BLOCKS * BLOCK);
	CHECK(mlx5dv_destroy_mkey(mk) == 0 && mlx5dv_dek_destroy(d) == 0,
	      "the MKEY and the DEK are destroyed");
	return failures ? 1 : 0;
}

/* -- signature pipelining ---------------------------------------------------------------------- */

static int pipelining(void)
{
	struct side s = {0};
	struct ibv_qp_attr a = {0};
	struct ibv_async_event ev;
	int rc;

	open_dv_side(&s, MLX5DV_QP_CREATE_SIG_PIPELINING);
	CHECK(1, "mlx5dv_create_qp with MLX5DV_QP_CREATE_SIG_PIPELINING");
	a.qp_state = IBV_QPS_SQD;
	a.en_sqd_async_notify = 1;
	rc = ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY);
	CHECK(rc == 0, "ibv_modify_qp to SQD with en_sqd_async_notify: %s", strerror(rc));
	rc = ibv_get_async_event(s.ctx, &ev);
	CHECK(rc == 0 && ev.event_type == IBV_EVENT_SQ_DRAINED && ev.element.qp == s.qp,
	      "ibv_get_async_event: %s on the QP",
	      rc ? strerror(errno) : ibv_event_type_str(ev.event_type));
	if (!rc)
		ibv_ack_async_event(&ev);
	rc = mlx5dv_qp_cancel_posted_send_wrs(s.mqp, 42);
	CHECK(rc == 0, "mlx5dv_qp_cancel_posted_send_wrs in SQD with nothing posted: %d", rc);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	rc = ibv_modify_qp(s.qp, &a, IBV_QP_STATE);
	CHECK(rc == 0, "ibv_modify_qp back to RTS: %s", strerror(rc));
	rc = mlx5dv_qp_cancel_posted_send_wrs(s.mqp, 42);
	CHECK(rc == -EINVAL, "mlx5dv_qp_cancel_posted_send_wrs outside SQD: %d (-EINVAL)", rc);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "caps"))
		return caps();
	if (argc == 2 && !strcmp(argv[1], "sig"))
		return sig();
	if (argc == 2 && !strcmp(argv[1], "bad"))
		return bad();
	if (argc == 4 && !strcmp(argv[1], "dek"))
		return dek(argv[2], argv[3]);
	if (argc == 4 && !strcmp(argv[1], "crypto"))
		return crypto(argv[2], argv[3]);
	if (argc == 2 && !strcmp(argv[1], "pipelining"))
		return pipelining();
	if (argc == 2 && !strcmp(argv[1], "absent"))
		return absent();
	if (argc == 2 && !strcmp(argv[1], "layouts"))
		return layouts();
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "sig-peer"))
		return sig_peer(atoi(argv[2]), argc == 4 ? argv[3] : NULL);
	fprintf(stderr, "usage: dvcheck caps | sig | bad | dek CRED KEY | crypto KEY TWEAK | "
		"pipelining | absent | layouts | sig-peer PORT [HOST]\n");
	return 2;
}
