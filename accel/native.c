/*
 * softhca.accel._native: the engine's per-block work in one C call per transfer.
 *
 * engine/signature.py and engine/xts.py are the reference; this module does the same
 * bytes with no Python call per protection block or data unit, the GIL released:
 *
 *   SigPlan(block_size, in_spec, out_spec, check_mask, copy_bits).run(src, dst, n, tail,
 *           first_block, results=None) -> None | (field, actual, expected, offset)
 *       every block: data copied, input PI checked under check_mask (escapes, REF_REMAP),
 *       output PI generated (copy_bits taken from the input PI), the tail copied as plain
 *       data. The first failing block's field (1 guard, 2 ref tag, 3 app tag: the
 *       mlx5dv_mkey_err_type values), the computed value, the stored value and the byte
 *       offset of the block in the input stream, exactly as the Python engine reports it.
 *   XtsKey(key1 || key2)  and  xts(key, src, dst, unit_size, dusn_lo, dusn_hi, encrypt)
 *       AES-XTS (IEEE 1619) over consecutive data units, unit k with the data unit
 *       sequence number dusn + k (mod 2^128), a short last unit with ciphertext stealing.
 *
 * Guards come from ISA-L (T10-DIF CRC, CRC32 MSB-first, CRC32C), crc64.c for CRC-64/NVME
 * (ISA-L 2.30 has no such polynomial), a plain loop for the IP checksum. Without SSE4.2
 * and PCLMULQDQ (or after portable_guards(True), which the tests use to run that path on
 * any CPU) they are ISA-L's base (table) functions and crc64.c's table.
 * XTS is AES-NI (xts_aesni.c, with VAES in xts_vaes.c) when the CPU has it, OpenSSL's EVP
 * otherwise.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <isa-l/crc.h>

#include "crc64.h"
#include "xts.h"

enum { K_T10DIF_CRC, K_T10DIF_CSUM, K_CRC32, K_CRC32C, K_CRC64 };
enum { F_GUARD = 1, F_REFTAG = 2, F_APPTAG = 3 };           /* mlx5dv_mkey_err_type */
/* enum mlx5dv_sig_t10dif_flags */
#define T10_REF_REMAP 1u
#define T10_APP_ESCAPE 2u
#define T10_APP_REF_ESCAPE 4u

typedef struct {
    int present, kind, t10, pi_size;
    uint64_t seed, app_tag, ref_tag;
    unsigned flags;
} domain_t;

/* ---------------------------------------------------------------- guards */

/* RFC 1071 over big-endian words, an odd last byte padded with zero, bg added, folded. */
static uint64_t ip_csum(const uint8_t *p, size_t len, uint64_t bg)
{
    uint64_t s = 0;
    size_t i = 0;
    for (; i + 1 < len; i += 2)
        s += (uint64_t)p[i] << 8 | p[i + 1];
    if (len & 1)
        s += (uint64_t)p[len - 1] << 8;
    s += bg;
    while (s > 0xFFFF)
        s = (s & 0xFFFF) + (s >> 16);
    return s ^ 0xFFFF;
}

/* The CPU lacks SSE4.2 or PCLMULQDQ, or portable_guards(True) was called: every guard
 * from a table, as on a CPU without them (ISA-L's dispatchers would pick the same base
 * functions there; saying so here lets a test run that path on this CPU). Both give the
 * same values, so a switch while another thread runs a transfer changes only its speed. */
static int portable;

/* The guard of ``kind`` at register start ``seed`` (mlx5dv_wr_set_mkey_sig_block(3) seeds). */
static uint64_t guard_of(int kind, uint64_t seed, const uint8_t *p, size_t len)
{
    switch (kind) {
    case K_T10DIF_CRC:
        return portable ? crc16_t10dif_base((uint16_t)seed, (uint8_t *)p, len)
                        : crc16_t10dif((uint16_t)seed, p, len);
    case K_T10DIF_CSUM:
        return ip_csum(p, len, seed);
    case K_CRC32:
        /* ISA-L's crc32_ieee inverts its argument and its result. */
        return portable ? crc32_ieee_base(~(uint32_t)seed, (uint8_t *)p, len)
                        : crc32_ieee(~(uint32_t)seed, p, len);
    case K_CRC32C:
        return (portable ? crc32_iscsi_base((unsigned char *)p, (int)len, (uint32_t)seed)
                         : crc32_iscsi((unsigned char *)p, (int)len, (uint32_t)seed))
               ^ 0xFFFFFFFFu;
    default:
        return portable ? crc64_nvme_table(seed, p, len) : crc64_nvme(seed, p, len);
    }
}

/* ---------------------------------------------------------------- PI integers */

static inline uint64_t load_pi(const uint8_t *p, int pi_size)
{
    if (pi_size == 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        return __builtin_bswap64(v);
    }
    uint32_t v;
    memcpy(&v, p, 4);
    return __builtin_bswap32(v);
}

static inline void store_pi(uint8_t *p, int pi_size, uint64_t v)
{
    if (pi_size == 8) {
        v = __builtin_bswap64(v);
        memcpy(p, &v, 8);
    } else {
        uint32_t w = __builtin_bswap32((uint32_t)v);
        memcpy(p, &w, 4);
    }
}

/* The bits of a PI integer that the byte columns of ``mask`` hold (bit 7 is PI byte 0). */
static uint64_t mask_bits(unsigned mask, int pi_size)
{
    uint64_t bits = 0;
    for (int i = 0; i < pi_size && i < 8; i++)
        if (mask >> (7 - i) & 1)
            bits |= 0xFFULL << 8 * (pi_size - 1 - i);
    return bits;
}

/* What a domain's PI should hold for block ``block`` (absolute index) with guard ``g``. */
static inline uint64_t pi_value(const domain_t *d, uint64_t g, uint64_t block)
{
    if (!d->t10)
        return g;
    uint64_t ref = d->flags & T10_REF_REMAP ? (block + d->ref_tag) & 0xFFFFFFFFu : d->ref_tag;
    return g << 48 | d->app_tag << 32 | ref;
}

/* ---------------------------------------------------------------- result bytes */

/* The bytes a call hands out as its result. The last one is kept here, and when the
 * caller has dropped it (this is the only reference left) the next call of the same size
 * writes into it again instead of allocating: a fresh multi-megabyte object costs its
 * page faults on every transfer on this machine (2.8 ms per 4 MiB measured, seven times
 * the CRC work). Nobody else can see the object while it is rewritten; its cached hash
 * is reset. One object process-wide, at most SPARE_MAX bytes, so memory stays bounded. */
#define SPARE_MAX (16 << 20)
static PyObject *spare;

static PyObject *result_bytes(Py_ssize_t len)
{
    if (spare && Py_REFCNT(spare) == 1 && PyBytes_GET_SIZE(spare) == len) {
        /* CPython keeps a bytes object's hash in it (deprecated for users since 3.11,
         * still there): -1 is "not computed". */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        ((PyBytesObject *)spare)->ob_shash = -1;
#pragma GCC diagnostic pop
        return Py_NewRef(spare);
    }
    PyObject *b = PyBytes_FromStringAndSize(NULL, len);
    if (b && len >= 4096 && len <= SPARE_MAX) {
        Py_XSETREF(spare, Py_NewRef(b));
    }
    return b;
}

/* ---------------------------------------------------------------- SigPlan */

typedef struct {
    PyObject_HEAD
    Py_ssize_t block_size;
    domain_t in, out;
    uint64_t check_bits, copy_bits;
    int check_guard, need_out_guard, shared_guard;
} SigPlanObject;

static int parse_domain(PyObject *spec, domain_t *d)
{
    memset(d, 0, sizeof *d);
    if (spec == Py_None)
        return 0;
    unsigned long long seed, app, ref;
    if (!PyArg_ParseTuple(spec, "iiiKKKI;domain spec (kind, t10, pi_size, seed, app_tag, ref_tag, flags)",
                          &d->kind, &d->t10, &d->pi_size, &seed, &app, &ref, &d->flags))
        return -1;
    if (d->kind < K_T10DIF_CRC || d->kind > K_CRC64 || (d->pi_size != 4 && d->pi_size != 8)) {
        PyErr_SetString(PyExc_ValueError, "bad domain spec");
        return -1;
    }
    d->present = 1;
    d->seed = seed;
    d->app_tag = app & 0xFFFF;
    d->ref_tag = ref & 0xFFFFFFFFu;
    return 0;
}

static int sigplan_init(SigPlanObject *self, PyObject *args, PyObject *kw)
{
    PyObject *in_spec, *out_spec;
    unsigned check_mask;
    unsigned long long copy_bits;
    static char *names[] = {"block_size", "in_spec", "out_spec", "check_mask", "copy_bits", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nOOIK", names, &self->block_size, &in_spec,
                                     &out_spec, &check_mask, &copy_bits))
        return -1;
    if (self->block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be positive");
        return -1;
    }
    if (parse_domain(in_spec, &self->in) || parse_domain(out_spec, &self->out))
        return -1;
    self->check_bits = self->in.present ? mask_bits(check_mask, self->in.pi_size) : 0;
    self->copy_bits = self->in.present && self->out.present ? copy_bits : 0;
    uint64_t in_guard_bits = self->in.t10 ? 0xFFFFULL << 48 : ~0ULL;
    uint64_t out_guard_bits = self->out.t10 ? 0xFFFFULL << 48 : ~0ULL;
    self->check_guard = (self->check_bits & in_guard_bits) != 0;
    self->need_out_guard = self->out.present && (out_guard_bits & ~self->copy_bits) != 0;
    self->shared_guard = self->in.present && self->out.present && self->in.kind == self->out.kind
                         && self->in.seed == self->out.seed;
    return 0;
}

typedef struct {
    int field;
    uint64_t actual, expected, offset;
} sig_error_t;

/* Which field of a failing T10-DIF / CRC block fails first (GUARD, APPTAG, REFTAG), or 0. */
static inline int failing_field(const domain_t *d, uint64_t stored, uint64_t diff)
{
    if (!diff)
        return 0;
    if (!d->t10)
        return F_GUARD;
    uint64_t app = stored >> 32 & 0xFFFF, ref = stored & 0xFFFFFFFFu;
    /* docs/semantics.md 6.1: APP_REF_ESCAPE wins when both escape flags are set. */
    if (d->flags & T10_APP_REF_ESCAPE) {
        if (app == 0xFFFF && ref == 0xFFFFFFFFu)
            return 0;
    } else if (d->flags & T10_APP_ESCAPE && app == 0xFFFF) {
        return 0;
    }
    if (diff >> 48)
        return F_GUARD;
    if (diff >> 32 & 0xFFFF)
        return F_APPTAG;
    return F_REFTAG;
}

static void field_values(const domain_t *d, int field, uint64_t want, uint64_t stored,
                         sig_error_t *e)
{
    e->field = field;
    if (!d->t10) {
        e->actual = want;
        e->expected = stored;
    } else if (field == F_GUARD) {
        e->actual = want >> 48;
        e->expected = stored >> 48;
    } else if (field == F_APPTAG) {
        e->actual = want >> 32 & 0xFFFF;
        e->expected = stored >> 32 & 0xFFFF;
    } else {
        e->actual = want & 0xFFFFFFFFu;
        e->expected = stored & 0xFFFFFFFFu;
    }
}

/* Each block is copied, then its guards are computed over the copy while it is still in
 * L1. A transfer of megabytes is bound by the copy: every output line is read for
 * ownership before it is written, two cache misses a line where a guard alone has one,
 * and the guard over L1-resident bytes is hidden under them. The same holds for copies
 * with the guard fused in: ISA-L's crc16_t10dif_copy (128-bit folds, 5.3-10 GB/s here)
 * and a 3-way crc32 loop (7.9 GB/s) were each slower than memcpy plus the AVX-512 guard
 * ISA-L dispatches to (12-14 GB/s, about memcpy's own speed). */
static void sig_blocks(const SigPlanObject *p, const uint8_t *src, uint8_t *dst, Py_ssize_t n,
                       uint64_t first_block, uint8_t *results, sig_error_t *err)
{
    const size_t bs = (size_t)p->block_size;
    const size_t in_w = bs + (p->in.present ? p->in.pi_size : 0);
    const size_t out_w = bs + (p->out.present ? p->out.pi_size : 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint8_t *s = src + (size_t)i * in_w;
        uint8_t *o = dst + (size_t)i * out_w;
        uint64_t block = first_block + (uint64_t)i, out_g = 0, in_g = 0;
        memcpy(o, s, bs);
        if (p->need_out_guard)
            out_g = guard_of(p->out.kind, p->out.seed, o, bs);
        uint64_t stored = p->in.present ? load_pi(s + bs, p->in.pi_size) : 0;
        if (p->check_bits) {
            if (p->check_guard)
                in_g = p->shared_guard && p->need_out_guard ? out_g
                                                            : guard_of(p->in.kind, p->in.seed, o, bs);
            uint64_t want = pi_value(&p->in, in_g, block);
            int field = failing_field(&p->in, stored, (stored ^ want) & p->check_bits);
            if (field) {
                if (results)
                    results[i] = (uint8_t)field;
                if (!err->field) {
                    field_values(&p->in, field, want, stored, err);
                    err->offset = (uint64_t)i * in_w;
                }
            }
        }
        if (p->out.present) {
            uint64_t v = pi_value(&p->out, out_g, block);
            v = (v & ~p->copy_bits) | (stored & p->copy_bits);
            store_pi(o + bs, p->out.pi_size, v);
        }
    }
}

/* The whole transfer: into dst (dst_len bytes), or into a new bytes object when dst is NULL
 * (*fresh set), which the caller hands out as is, saving the copy a bytes of the result
 * would cost. Returns the error tuple or None; NULL with an exception. */
static PyObject *sigplan_do(SigPlanObject *self, Py_buffer *src, uint8_t *dst, Py_ssize_t dst_len,
                            Py_ssize_t n, Py_ssize_t tail, unsigned long long first_block,
                            PyObject *results, PyObject **fresh)
{
    Py_buffer res = {0};
    PyObject *ret = NULL;
    size_t bs = (size_t)self->block_size;
    size_t in_w = bs + (self->in.present ? self->in.pi_size : 0);
    size_t out_w = bs + (self->out.present ? self->out.pi_size : 0);
    if (n < 0 || tail < 0 || (size_t)tail > bs || n > PY_SSIZE_T_MAX / (Py_ssize_t)(in_w + out_w)
        || (size_t)src->len < (size_t)n * in_w + (size_t)tail
        || (dst && (size_t)dst_len < (size_t)n * out_w + (size_t)tail)) {
        PyErr_SetString(PyExc_ValueError, "SigPlan.run: buffers too short for n blocks and tail");
        return NULL;
    }
    if (results != Py_None) {
        if (PyObject_GetBuffer(results, &res, PyBUF_WRITABLE) < 0)
            return NULL;
        if (res.len < n) {
            PyErr_SetString(PyExc_ValueError, "SigPlan.run: results shorter than n");
            goto out;
        }
        memset(res.buf, 0, (size_t)n);
    }
    if (!dst) {
        *fresh = result_bytes((Py_ssize_t)((size_t)n * out_w + (size_t)tail));
        if (!*fresh)
            goto out;
        dst = (uint8_t *)PyBytes_AS_STRING(*fresh);
    }
    sig_error_t err = {0};
    Py_BEGIN_ALLOW_THREADS
    sig_blocks(self, src->buf, dst, n, first_block, res.obj ? res.buf : NULL, &err);
    memmove(dst + (size_t)n * out_w, (const uint8_t *)src->buf + (size_t)n * in_w, (size_t)tail);
    Py_END_ALLOW_THREADS
    if (err.field)
        ret = Py_BuildValue("iKKK", err.field, (unsigned long long)err.actual,
                            (unsigned long long)err.expected, (unsigned long long)err.offset);
    else
        ret = Py_NewRef(Py_None);
out:
    if (res.obj)
        PyBuffer_Release(&res);
    return ret;
}

static PyObject *sigplan_run(SigPlanObject *self, PyObject *args, PyObject *kw)
{
    Py_buffer src, dst;
    Py_ssize_t n, tail;
    unsigned long long first_block;
    PyObject *results = Py_None;
    static char *names[] = {"src", "dst", "n", "tail", "first_block", "results", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*w*nnK|O", names, &src, &dst, &n, &tail,
                                     &first_block, &results))
        return NULL;
    PyObject *ret = sigplan_do(self, &src, dst.buf, dst.len, n, tail, first_block, results, NULL);
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return ret;
}

static PyObject *sigplan_run_bytes(SigPlanObject *self, PyObject *args, PyObject *kw)
{
    Py_buffer src;
    Py_ssize_t n, tail;
    unsigned long long first_block;
    PyObject *results = Py_None, *fresh = NULL;
    static char *names[] = {"src", "n", "tail", "first_block", "results", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*nnK|O", names, &src, &n, &tail, &first_block,
                                     &results))
        return NULL;
    PyObject *err = sigplan_do(self, &src, NULL, 0, n, tail, first_block, results, &fresh);
    PyBuffer_Release(&src);
    if (!err) {
        Py_XDECREF(fresh);
        return NULL;
    }
    PyObject *ret = PyTuple_Pack(2, fresh, err);
    Py_DECREF(fresh);
    Py_DECREF(err);
    return ret;
}

static PyMethodDef sigplan_methods[] = {
    {"run", (PyCFunction)(void (*)(void))sigplan_run, METH_VARARGS | METH_KEYWORDS,
     "run(src, dst, n, tail, first_block, results=None): check, copy and generate every block"},
    {"run_bytes", (PyCFunction)(void (*)(void))sigplan_run_bytes, METH_VARARGS | METH_KEYWORDS,
     "run_bytes(src, n, tail, first_block, results=None) -> (bytes, error): run into new bytes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SigPlanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "softhca.accel._native.SigPlan",
    .tp_basicsize = sizeof(SigPlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One direction of a signature configuration, prepared once.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sigplan_init,
    .tp_methods = sigplan_methods,
};

/* ---------------------------------------------------------------- XTS */

typedef struct {
    PyObject_HEAD
    xts_key_t key;
} XtsKeyObject;

static int xtskey_init(XtsKeyObject *self, PyObject *args, PyObject *kw)
{
    Py_buffer key;
    const char *impl = "auto";
    static char *names[] = {"key", "impl", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|s", names, &key, &impl))
        return -1;
    int which = !strcmp(impl, "aesni") ? XTS_AESNI : !strcmp(impl, "openssl") ? XTS_OPENSSL
              : !strcmp(impl, "vaes") ? XTS_VAES : !strcmp(impl, "auto") ? XTS_AUTO : -1;
    int rc = 0;
    xts_key_free(&self->key);
    if (which < 0) {
        PyErr_Format(PyExc_ValueError, "XTS impl %s: expected auto, vaes, aesni or openssl", impl);
        rc = -1;
    } else if (key.len != 32 && key.len != 64) {
        PyErr_Format(PyExc_ValueError, "XTS key must be 32 or 64 bytes (key1||key2), got %zd",
                     key.len);
        rc = -1;
    } else if (xts_key_set(&self->key, key.buf, (size_t)key.len, which) < 0) {
        /* No AES-NI for impl="aesni", or OpenSSL refusing the key (equal halves). */
        PyErr_Format(PyExc_ValueError, "XTS key set-up failed with impl %s", impl);
        rc = -1;
    }
    PyBuffer_Release(&key);
    return rc;
}

static void xtskey_dealloc(XtsKeyObject *self)
{
    xts_key_free(&self->key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *xtskey_impl(XtsKeyObject *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(xts_key_impl(&self->key));
}

static PyGetSetDef xtskey_getset[] = {
    {"impl", (getter)xtskey_impl, NULL, "vaes, aesni or openssl: what runs this key's units",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject XtsKeyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "softhca.accel._native.XtsKey",
    .tp_basicsize = sizeof(XtsKeyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An AES-XTS key (key1 || key2) expanded once, for any number of transfers.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)xtskey_init,
    .tp_dealloc = (destructor)xtskey_dealloc,
    .tp_getset = xtskey_getset,
};

static PyObject *native_xts(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    PyObject *keyobj, *dstobj, *fresh = NULL;
    Py_buffer src, dst = {0};
    Py_ssize_t unit;
    unsigned long long lo, hi;
    int encrypt;
    static char *names[] = {"key", "src", "dst", "unit_size", "dusn_lo", "dusn_hi", "encrypt", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!y*OnKKp", names, &XtsKeyType, &keyobj, &src,
                                     &dstobj, &unit, &lo, &hi, &encrypt))
        return NULL;
    PyObject *ret = NULL;
    uint8_t *out;
    if (dstobj == Py_None) {
        /* A new bytes object, handed out as the result: no copy of it afterwards. */
        if (!(fresh = result_bytes(src.len)))
            goto out;
        out = (uint8_t *)PyBytes_AS_STRING(fresh);
    } else {
        if (PyObject_GetBuffer(dstobj, &dst, PyBUF_WRITABLE) < 0)
            goto out;
        out = dst.buf;
    }
    Py_ssize_t tail = unit > 0 ? src.len % unit : 0;
    if (unit < 16 || (tail > 0 && tail < 16) || (!fresh && dst.len != src.len)) {
        PyErr_SetString(PyExc_ValueError, "xts: data units of at least 16 bytes, dst as long as src");
        goto out;
    }
    int rc;
    xts_key_t *key = &((XtsKeyObject *)keyobj)->key;
    Py_BEGIN_ALLOW_THREADS
    rc = xts_units(key, src.buf, out, (size_t)src.len, (size_t)unit, lo, hi, encrypt);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        PyErr_SetString(PyExc_RuntimeError, "xts: the cipher failed");
    else
        ret = fresh ? Py_NewRef(fresh) : Py_NewRef(Py_None);
out:
    Py_XDECREF(fresh);
    PyBuffer_Release(&src);
    if (dst.obj)
        PyBuffer_Release(&dst);
    return ret;
}

static PyObject *native_guard(PyObject *mod, PyObject *args)
{
    (void)mod;
    int kind;
    unsigned long long seed;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "iKy*", &kind, &seed, &buf))
        return NULL;
    if (kind < K_T10DIF_CRC || kind > K_CRC64) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "unknown guard kind");
        return NULL;
    }
    uint64_t g = guard_of(kind, seed, buf.buf, (size_t)buf.len);
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLongLong(g);
}

static int cpu_has_clmul_crc(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
#else
    return 0;
#endif
}

static PyObject *native_portable_guards(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *flag = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &flag))
        return NULL;
    PyObject *was = PyBool_FromLong(portable);
    if (flag != Py_None) {
        int on = PyObject_IsTrue(flag);
        if (on < 0) {
            Py_DECREF(was);
            return NULL;
        }
        /* Off only where the CPU has the instructions: never the fast path without them. */
        portable = on || !cpu_has_clmul_crc();
    }
    return was;
}

static PyMethodDef native_methods[] = {
    {"xts", (PyCFunction)(void (*)(void))native_xts, METH_VARARGS | METH_KEYWORDS,
     "xts(key, src, dst, unit_size, dusn_lo, dusn_hi, encrypt): AES-XTS over every data unit; "
     "into new bytes, returned, when dst is None"},
    {"guard", native_guard, METH_VARARGS,
     "guard(kind, seed, buffer): one guard (0 T10-DIF CRC, 1 IP checksum, 2 CRC32, 3 CRC32C, "
     "4 CRC64_XP10)"},
    {"portable_guards", native_portable_guards, METH_VARARGS,
     "portable_guards(on=None) -> bool: whether guards come from tables (no SSE4.2/PCLMULQDQ), "
     "as it was before; on=True forces the tables, on=False returns to what the CPU has"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The engine's signature and XTS work, one C call per transfer (accel/native.c).", -1,
    native_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void)
{
    crc64_setup();
    portable = !cpu_has_clmul_crc();
    if (PyType_Ready(&SigPlanType) < 0 || PyType_Ready(&XtsKeyType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m)
        return NULL;
    if (PyModule_AddObjectRef(m, "SigPlan", (PyObject *)&SigPlanType) < 0
        || PyModule_AddObjectRef(m, "XtsKey", (PyObject *)&XtsKeyType) < 0
        || PyModule_AddStringConstant(m, "xts_impl", xts_default_impl()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
