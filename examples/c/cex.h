/* The boilerplate the example programs share: the device, one RC QP able to post MKEY
 * configure WRs, the connection of two programs over TCP (as ibv_rc_pingpong does it),
 * the data operations, and what the programs print.
 *
 * Each example is run twice, once per side:
 *
 *     prog [-p PORT] [-d DEVICE] [-g GID_INDEX]        the passive side, the target
 *     prog [-p PORT] [-d DEVICE] [-g GID_INDEX] ADDR   the active side, the initiator
 *
 * Both sides' lines on stdout are stable and parseable:
 *
 *     image NAME LEN HEX        a buffer's bytes
 *     key HEX / tweak HEX       crypto material the program chose
 *     block NAME B guard=0x.. app=0x.. ref=0x..   one block's T10-DIF as found
 *     mkey_check NAME err_type=.. actual=0x.. expected=0x.. offset=N
 *     check ok|FAILED: TEXT     a judgement the program can make itself
 *     PASS | FAIL               the last line; the exit status is 0 only on PASS
 */
#ifndef CEX_H
#define CEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#define CEX_DEFAULT_PORT 18515

/* What one side tells the other: its QP, its GID, and the buffer (or MKEY) it offers
 * for RDMA (rkey 0 and length 0 when it offers none). */
struct cex_peer {
	uint32_t qpn;
	uint32_t psn;
	union ibv_gid gid;
	uint32_t rkey;
	uint64_t addr;
	uint64_t len;
};

struct cex {
	const char *prog;
	const char *peer_addr; /* NULL on the passive side */
	const char *dev_name;
	int port;
	int gid_index;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct mlx5dv_qp_ex *mqpx;
	int sock;
	struct cex_peer me, peer;
	uint64_t next_wr_id;
	int failures;
};

/* Parses the command line; exits with a usage line on a bad one. */
void cex_args(struct cex *c, int argc, char **argv);
static inline bool cex_is_target(const struct cex *c) { return c->peer_addr == NULL; }

/* Opens the device (mlx5dv_open_device with DEVX, as the crypto verbs want), a PD, a CQ
 * and an RC QP made by mlx5dv_create_qp with SEND, RDMA_WRITE, RDMA_READ and
 * MLX5DV_QP_EX_WITH_MKEY_CONFIGURE. Exits on failure. */
void cex_open(struct cex *c);
/* cex_open's PD, CQ (cqe entries) and QP (max_wr WRs and max_sge SGEs each way) on ctx,
 * a context opened elsewhere (librdmacm's, for cm_dif). Exits on failure. */
void cex_open_qp(struct cex *c, struct ibv_context *ctx, int cqe, uint32_t max_wr,
		 uint32_t max_sge);
/* Exchanges QP numbers, GIDs and the offered buffer (rkey, addr, len) with the peer over
 * TCP and takes the QP to RTS towards it. */
void cex_connect(struct cex *c, uint32_t rkey, uint64_t addr, uint64_t len);
/* Both sides wait until the other reached the same named point. */
void cex_barrier(struct cex *c, const char *name);
void cex_close(struct cex *c);

/* The data operations, each posted with ibv_wr_* and waited for (its completion must be
 * IBV_WC_SUCCESS; anything else exits). */
void cex_send(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len);
/* cex_post_recv returns the receive's wr_id; cex_wait_recv waits for the last one
 * posted, cex_wait_recv_wr for the one named (several posted at once). */
uint64_t cex_post_recv(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len);
void cex_wait_recv(struct cex *c, uint32_t expect_len);
void cex_wait_recv_wr(struct cex *c, uint64_t wr_id, uint32_t expect_len);
void cex_rdma_write(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len,
		    uint32_t rkey, uint64_t raddr);
void cex_rdma_read(struct cex *c, uint32_t lkey, uint64_t addr, uint32_t len,
		   uint32_t rkey, uint64_t raddr);

/* mlx5dv_create_mkey on the side's PD. */
struct mlx5dv_mkey *cex_create_mkey(struct cex *c, uint32_t create_flags, uint16_t max_entries);

/* One configure WR (mlx5dv_wr_mkey_configure and its setters, ibv_wr_complete), waited
 * for as its MLX5DV_WC_UMR completion. Exactly one of sge / interleaved is given; sig
 * and crypto may be NULL. */
struct cex_layout {
	uint16_t num_sges;
	const struct ibv_sge *sges;
	uint32_t repeat_count;
	uint16_t num_interleaved;
	const struct mlx5dv_mr_interleaved *interleaved;
};
void cex_configure(struct cex *c, struct mlx5dv_mkey *mkey, uint32_t access,
		   const struct cex_layout *layout, const struct mlx5dv_sig_block_attr *sig,
		   const struct mlx5dv_crypto_attr *crypto);
/* cex_configure of mkey over one SGE with only a wire domain: T10-DIF, a CRC guard
 * seeded with bg, app and ref (REF_REMAP), 512-byte blocks, every check (0xff): the
 * MKEY that dif_write, mkey_check and cm_dif write and read through. */
void cex_configure_wire_dif(struct cex *c, struct mlx5dv_mkey *mkey, uint32_t access,
			    struct ibv_sge *sge, uint16_t bg, uint16_t app, uint32_t ref);

/* The initiator's part of dif_write and cm_dif: len bytes of data (cex_pattern) copied
 * into mem, registered, and a signature MKEY (INDIRECT | BLOCK_SIGNATURE) to configure
 * over the SGE of mem; wire_len is what it spans on the wire, the PIs included. */
struct cex_dif_io {
	uint8_t *mem, *data;
	uint32_t len, wire_len;
	struct ibv_mr *mr;
	struct ibv_sge sge;
	struct mlx5dv_mkey *mkey;
};
void cex_dif_io_init(struct cex *c, struct cex_dif_io *io, uint32_t len, uint32_t wire_len,
		     uint64_t seed);
/* RDMA_WRITE through the MKEY (from its 0) to the peer's buffer, then mkey_check: prints
 * image initiator_memory and mkey_check after_write. */
void cex_dif_io_write(struct cex *c, struct cex_dif_io *io);
/* RDMA_READ through the MKEY into a zeroed mem, which must be the data again (the PIs
 * checked and stripped), then mkey_check: image initiator_memory_read, after_read. */
void cex_dif_io_read(struct cex *c, struct cex_dif_io *io);
void cex_dif_io_free(struct cex_dif_io *io);

/* mlx5dv_dek_create of a plaintext AES-XTS key (key1 | key2, 32 or 64 bytes). */
struct mlx5dv_dek *cex_create_dek(struct cex *c, const uint8_t *key, size_t key_len);

/* struct mlx5dv_crypto_attr for AES-XTS with dek: the initial tweak is the 128-bit
 * number 0x112233445566778899aabbccddeeff00, little endian (the value the crypto table of
 * `softhca explain` uses: every byte differs, so a byte order slip shows); printed. */
struct mlx5dv_crypto_attr cex_crypto_attr(struct mlx5dv_dek *dek, bool encrypt_on_tx,
					  enum mlx5dv_signature_crypto_order order,
					  enum mlx5dv_block_size data_unit_size);

/* mlx5dv_mkey_check, printed; returns the error found. */
struct mlx5dv_mkey_err cex_mkey_check(struct cex *c, const char *name, struct mlx5dv_mkey *mkey);

/* Memory every MR needs: the heap, page aligned and zeroed. */
uint8_t *cex_alloc(size_t len);
struct ibv_mr *cex_reg_mr(struct cex *c, void *buf, size_t len);

/* The bytes an example moves: the same on both sides for the same seed. */
void cex_pattern(uint8_t *buf, size_t len, uint64_t seed);

/* The block signatures, computed here (not by the device). */
uint16_t cex_crc16_t10dif(uint16_t seed, const uint8_t *buf, size_t len);
uint32_t cex_crc32(uint32_t seed, const uint8_t *buf, size_t len);
/* A T10-DIF PI: guard (CRC seeded with bg), app tag, ref tag, big endian. */
void cex_t10dif_pi(uint8_t pi[8], const uint8_t *block, size_t block_len, uint16_t bg,
		   uint16_t app_tag, uint32_t ref_tag);
/* Checks n blocks of block_len bytes each followed by an 8-byte T10-DIF with app_tag
 * and ref_tag + b (REF_REMAP), printing each; returns the number of bad blocks. */
int cex_check_dif(struct cex *c, const char *name, const uint8_t *image, size_t n,
		  size_t block_len, uint16_t bg, uint16_t app_tag, uint32_t ref_tag);
uint32_t cex_be32(const uint8_t *p);
uint16_t cex_be16(const uint8_t *p);

void cex_image(const char *name, const uint8_t *buf, size_t len);
void cex_hex_line(const char *what, const uint8_t *buf, size_t len);
/* Records a judgement; a false one makes the program FAIL. */
void cex_check(struct cex *c, bool ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Prints PASS or FAIL, closes everything; the exit status. */
int cex_finish(struct cex *c);
/* The whole of a two-sided example's main: cex_args, cex_open, then target or initiator
 * by the side the command line names, and cex_finish's exit status. */
int cex_main(int argc, char **argv, void (*target)(struct cex *c),
	     void (*initiator)(struct cex *c));
void cex_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
