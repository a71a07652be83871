/* CRC32C computed while the block is copied: the SSE4.2 crc32 instruction on three
 * stretches of the block at once (its latency is three cycles, its throughput one), each
 * word stored to the destination as it is read, so the copy costs nothing beside the
 * CRC. The three registers are joined by shifting the first two over the bytes after
 * them: a register shifted over n zero bytes is c * x^(8n) mod P, one carry-less multiply
 * by x^(8n-33) mod P (the extra x of a reflected product and the x^32 of the crc32
 * instruction make up the rest) reduced by the crc32 instruction itself. Compiled with
 * -msse4.2 -mpclmul; native.c uses it only when the CPU has both. */
#include <immintrin.h>
#include <string.h>

#include "crc32c.h"

static const uint32_t POLY = 0x1EDC6F41u;          /* x^32 implied */

static uint32_t reflect32(uint32_t v)
{
    uint32_t r = 0;
    for (int i = 0; i < 32; i++)
        r |= (v >> i & 1) << (31 - i);
    return r;
}

/* x^n mod P, unreflected. */
static uint32_t xpow_mod(unsigned n)
{
    uint32_t r = 1;
    while (n--)
        r = (r << 1) ^ (r >> 31 ? POLY : 0);
    return r;
}

int crc32c_copy_available(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
}

void crc32c_copy_setup(crc32c_copy_t *k, size_t len)
{
    k->len = len;
    k->seg = len / 3 / 8 * 8;
    k->shift_a = k->seg ? reflect32(xpow_mod((unsigned)(8 * (len - k->seg) - 33))) : 0;
    k->shift_b = k->seg ? reflect32(xpow_mod((unsigned)(8 * (len - 2 * k->seg) - 33))) : 0;
}

static inline uint32_t shift(uint32_t c, uint32_t k)
{
    __m128i p = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)c), _mm_cvtsi32_si128((int)k), 0);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(p));
}

uint32_t crc32c_copy(const crc32c_copy_t *k, uint32_t reg, uint8_t *dst, const uint8_t *src)
{
    const size_t len = k->len, seg = k->seg;
    uint64_t a = reg, b = 0, c = 0;
    if (seg < 8) {
        memcpy(dst, src, len);
        for (size_t i = 0; i < len; i++)
            a = _mm_crc32_u8((uint32_t)a, src[i]);
        return (uint32_t)a ^ 0xFFFFFFFFu;
    }
    for (size_t i = 0; i < seg; i += 8) {
        uint64_t wa, wb, wc;
        memcpy(&wa, src + i, 8);
        memcpy(&wb, src + seg + i, 8);
        memcpy(&wc, src + 2 * seg + i, 8);
        a = _mm_crc32_u64(a, wa);
        b = _mm_crc32_u64(b, wb);
        c = _mm_crc32_u64(c, wc);
        memcpy(dst + i, &wa, 8);
        memcpy(dst + seg + i, &wb, 8);
        memcpy(dst + 2 * seg + i, &wc, 8);
    }
    size_t i = 3 * seg;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        c = _mm_crc32_u64(c, w);
        memcpy(dst + i, &w, 8);
    }
    for (; i < len; i++) {
        c = _mm_crc32_u8((uint32_t)c, src[i]);
        dst[i] = src[i];
    }
    uint32_t joined = shift((uint32_t)a, k->shift_a) ^ shift((uint32_t)b, k->shift_b) ^ (uint32_t)c;
    return joined ^ 0xFFFFFFFFu;
}
