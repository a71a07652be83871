/* AES-XTS with AES-NI: the key schedules made once per DEK, eight blocks in flight so the
 * AES units stay busy, the tweak doubled in GF(2^128) per block (IEEE 1619 5.2), and
 * ciphertext stealing for a last block shorter than 16 bytes (IEEE 1619 5.3.2, 5.4.2).
 * Compiled with -maes -msse4.1 -mpclmul; xts.c calls it only after checking the CPU. */
#include <immintrin.h>
#include <string.h>

#include "xts.h"

#define LANES 8

static inline __m128i mul_alpha(__m128i t)
{
    /* Shift the 128-bit little-endian value left by one: each 32-bit lane's top bit moves
     * into the next lane, and bit 127 folds back as x^7 + x^2 + x + 1 (0x87). */
    __m128i carry = _mm_shuffle_epi32(_mm_srai_epi32(t, 31), 0x93);
    carry = _mm_and_si128(carry, _mm_set_epi32(1, 1, 1, 0x87));
    return _mm_xor_si128(_mm_slli_epi32(t, 1), carry);
}

/* t * alpha^16: a two-byte shift, the sixteen bits leaving bit 127 folded back as
 * bits * (x^7 + x^2 + x + 1), one carry-less multiply. Independent per tweak, so a batch
 * of sixteen tweaks is the previous batch's, each moved on at once (no chain). */
static inline __m128i mul_alpha16(__m128i t)
{
    __m128i top = _mm_srli_si128(t, 14);
    __m128i fold = _mm_clmulepi64_si128(top, _mm_cvtsi32_si128(0x87), 0x00);
    return _mm_xor_si128(_mm_slli_si128(t, 2), fold);
}

static inline __m128i shift_xor(__m128i k)
{
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
    return _mm_xor_si128(k, _mm_slli_si128(k, 4));
}

#define R128(i, rcon) \
    rk[i] = _mm_xor_si128(shift_xor(rk[i - 1]), \
                          _mm_shuffle_epi32(_mm_aeskeygenassist_si128(rk[i - 1], rcon), 0xff))

static void expand128(__m128i *rk, const uint8_t *key)
{
    rk[0] = _mm_loadu_si128((const __m128i *)key);
    R128(1, 0x01); R128(2, 0x02); R128(3, 0x04); R128(4, 0x08); R128(5, 0x10);
    R128(6, 0x20); R128(7, 0x40); R128(8, 0x80); R128(9, 0x1b); R128(10, 0x36);
}

#define R256(i, rcon) do { \
    rk[i] = _mm_xor_si128(shift_xor(rk[i - 2]), \
                          _mm_shuffle_epi32(_mm_aeskeygenassist_si128(rk[i - 1], rcon), 0xff)); \
    if (i + 1 < 15) \
        rk[i + 1] = _mm_xor_si128(shift_xor(rk[i - 1]), \
                                  _mm_shuffle_epi32(_mm_aeskeygenassist_si128(rk[i], 0), 0xaa)); \
} while (0)

static void expand256(__m128i *rk, const uint8_t *key)
{
    rk[0] = _mm_loadu_si128((const __m128i *)key);
    rk[1] = _mm_loadu_si128((const __m128i *)(key + 16));
    R256(2, 0x01); R256(4, 0x02); R256(6, 0x04); R256(8, 0x08);
    R256(10, 0x10); R256(12, 0x20); R256(14, 0x40);
}

void aesni_expand(xts_key_t *k, const uint8_t *key, size_t len)
{
    size_t half = len / 2;
    __m128i *enc = (__m128i *)k->enc, *dec = (__m128i *)k->dec, *tw = (__m128i *)k->tweak;
    k->rounds = half == 16 ? 10 : 14;
    if (half == 16) {
        expand128(enc, key);
        expand128(tw, key + half);
    } else {
        expand256(enc, key);
        expand256(tw, key + half);
    }
    /* The equivalent inverse cipher's schedule (FIPS 197 5.3.5). */
    dec[0] = enc[k->rounds];
    for (int i = 1; i < k->rounds; i++)
        dec[i] = _mm_aesimc_si128(enc[k->rounds - i]);
    dec[k->rounds] = enc[0];
}

static inline __m128i aes1(const __m128i *rk, int nr, __m128i b, int encrypt)
{
    b = _mm_xor_si128(b, rk[0]);
    if (encrypt) {
        for (int r = 1; r < nr; r++)
            b = _mm_aesenc_si128(b, rk[r]);
        return _mm_aesenclast_si128(b, rk[nr]);
    }
    for (int r = 1; r < nr; r++)
        b = _mm_aesdec_si128(b, rk[r]);
    return _mm_aesdeclast_si128(b, rk[nr]);
}

/* cnt (at most LANES) blocks, each xored with its tweak before and after the cipher; a
 * constant cnt lets the compiler keep the eight in registers. */
static inline __attribute__((always_inline)) void
aes_lanes(const __m128i *rk, int nr, const uint8_t *src, uint8_t *dst, const __m128i *t,
          int encrypt, int cnt)
{
    __m128i b[LANES];
    for (int i = 0; i < cnt; i++)
        b[i] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)src + i), _mm_xor_si128(t[i], rk[0]));
    if (encrypt) {
        for (int r = 1; r < nr; r++)
            for (int i = 0; i < cnt; i++)
                b[i] = _mm_aesenc_si128(b[i], rk[r]);
        for (int i = 0; i < cnt; i++)
            b[i] = _mm_aesenclast_si128(b[i], rk[nr]);
    } else {
        for (int r = 1; r < nr; r++)
            for (int i = 0; i < cnt; i++)
                b[i] = _mm_aesdec_si128(b[i], rk[r]);
        for (int i = 0; i < cnt; i++)
            b[i] = _mm_aesdeclast_si128(b[i], rk[nr]);
    }
    for (int i = 0; i < cnt; i++)
        _mm_storeu_si128((__m128i *)dst + i, _mm_xor_si128(b[i], t[i]));
}

/* The last cnt < LANES blocks of a unit's bulk, still in parallel. */
static void aes_rest(const __m128i *rk, int nr, const uint8_t *src, uint8_t *dst,
                     const __m128i *t, int encrypt, int cnt)
{
    aes_lanes(rk, nr, src, dst, t, encrypt, cnt);
}

/* The full blocks of one data unit whose initial tweak t (E_key2 of its sequence number)
 * is known. With stealing (len % 16 != 0), block m-1 is processed as any block, under
 * T_{m-1} when encrypting and under T_m when decrypting (IEEE 1619 5.3.2, 5.4.2), and
 * the tweak the padded partial block needs (T_m encrypting, T_{m-1} decrypting) is
 * returned: the caller finishes several units' last blocks together. */
static inline __m128i unit_bulk(const __m128i *rk, int nr, const uint8_t *src, uint8_t *dst,
                                size_t len, __m128i t, int encrypt, int vaes)
{
    size_t m = len / 16, r = len % 16, j = 0;
    __m128i lanes[2 * LANES], t_prev = t;
    int full = 0;       /* lanes[] holds the previous batch of sixteen, in order */
    while (j < m) {
        int most = vaes && m - j >= 2 * LANES ? 2 * LANES : LANES;
        int cnt = m - j < (size_t)most ? (int)(m - j) : most;
        if (full && cnt == 2 * LANES) {
            for (int i = 0; i < cnt; i++)
                lanes[i] = mul_alpha16(lanes[i]);
            t = mul_alpha16(t);
        } else {
            for (int i = 0; i < cnt; i++) {
                lanes[i] = t;
                t = mul_alpha(t);
            }
        }
        /* t is now the tweak of block j + cnt. */
        full = cnt == 2 * LANES;
        if (j + (size_t)cnt == m) {
            t_prev = lanes[cnt - 1];            /* T_{m-1}; t is T_m */
            if (r && !encrypt) {
                lanes[cnt - 1] = t;
                full = 0;
            }
        }
        if (cnt == 2 * LANES)
            vaes_16(rk, nr, src + 16 * j, dst + 16 * j, lanes, encrypt);
        else if (cnt == LANES)
            aes_lanes(rk, nr, src + 16 * j, dst + 16 * j, lanes, encrypt, LANES);
        else
            aes_rest(rk, nr, src + 16 * j, dst + 16 * j, lanes, encrypt, cnt);
        j += (size_t)cnt;
    }
    return encrypt ? t : t_prev;
}

/* Block m-1's result gives its first r bytes to the short last block and lends the rest
 * to pad the partial input, which is returned (ready for the cipher under its tweak). The
 * partial input is read before the short block is written, so src == dst works. */
static inline __m128i steal(const uint8_t *src, uint8_t *dst, size_t len)
{
    size_t m = len / 16, r = len % 16;
    uint8_t *last_out = dst + 16 * (m - 1);
    uint8_t cc[16], pp[16];
    memcpy(cc, last_out, 16);
    memcpy(pp, src + 16 * m, r);
    memcpy(pp + r, cc + r, 16 - r);
    memcpy(last_out + 16, cc, r);
    return _mm_loadu_si128((const __m128i *)pp);
}

/* cnt blocks decrypted in place, in parallel. */
static void aes_blocks_dec(const __m128i *rk, int nr, __m128i *b, int cnt)
{
    for (int i = 0; i < cnt; i++)
        b[i] = _mm_xor_si128(b[i], rk[0]);
    for (int r = 1; r < nr; r++)
        for (int i = 0; i < cnt; i++)
            b[i] = _mm_aesdec_si128(b[i], rk[r]);
    for (int i = 0; i < cnt; i++)
        b[i] = _mm_aesdeclast_si128(b[i], rk[nr]);
}

/* cnt blocks encrypted in place, in parallel (the tweaks of cnt units). */
static void aes_blocks(const __m128i *rk, int nr, __m128i *b, int cnt)
{
    for (int i = 0; i < cnt; i++)
        b[i] = _mm_xor_si128(b[i], rk[0]);
    for (int r = 1; r < nr; r++)
        for (int i = 0; i < cnt; i++)
            b[i] = _mm_aesenc_si128(b[i], rk[r]);
    for (int i = 0; i < cnt; i++)
        b[i] = _mm_aesenclast_si128(b[i], rk[nr]);
}

void aesni_units(const xts_key_t *k, const uint8_t *src, uint8_t *dst, size_t len,
                 size_t unit_len, uint64_t lo, uint64_t hi, int encrypt)
{
    const __m128i *rk = (const __m128i *)(encrypt ? k->enc : k->dec);
    const int nr = k->rounds;
    size_t off = 0;
    while (off < len) {
        /* The initial tweaks of up to LANES units, E_key2 of their sequence numbers, at once. */
        __m128i t[LANES], last[LANES], last_t[LANES];
        size_t where[LANES];
        int cnt = 0, stolen = 0;
        for (size_t o = off; o < len && cnt < LANES; o += unit_len, cnt++) {
            t[cnt] = _mm_set_epi64x((long long)hi, (long long)lo);
            if (++lo == 0)
                hi++;
        }
        aes_blocks((const __m128i *)k->tweak, nr, t, cnt);
        for (int i = 0; i < cnt; i++, off += unit_len) {
            size_t n = len - off < unit_len ? len - off : unit_len;
            __m128i second = unit_bulk(rk, nr, src + off, dst + off, n, t[i], encrypt,
                                       k->impl == XTS_VAES);
            if (n % 16) {
                last_t[stolen] = second;
                last[stolen] = _mm_xor_si128(steal(src + off, dst + off, n), second);
                where[stolen++] = off + 16 * (n / 16 - 1);
            }
        }
        /* The units' padded last blocks, in parallel: none waits for another's cipher. */
        if (stolen) {
            if (encrypt)
                aes_blocks(rk, nr, last, stolen);
            else
                aes_blocks_dec(rk, nr, last, stolen);
            for (int i = 0; i < stolen; i++)
                _mm_storeu_si128((__m128i *)(dst + where[i]), _mm_xor_si128(last[i], last_t[i]));
        }
    }
}
