/* Sixteen XTS blocks at once with VAES: each 256-bit AES instruction does two blocks, so
 * eight registers keep sixteen in flight, twice the AES-NI loop's throughput where the CPU
 * has VAES. Compiled with -mvaes -mavx2; xts_aesni.c calls it only when xts.c found VAES. */
#include <immintrin.h>

#include "xts.h"

void vaes_16(const void *round_keys, int nr, const uint8_t *src, uint8_t *dst,
             const void *tweaks, int encrypt)
{
    const __m128i *rk = round_keys, *tw = tweaks;
    __m256i b[8], t[8];
    __m256i k = _mm256_broadcastsi128_si256(rk[0]);
    for (int i = 0; i < 8; i++) {
        t[i] = _mm256_set_m128i(tw[2 * i + 1], tw[2 * i]);     /* the first block is low */
        b[i] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)src + i),
                                _mm256_xor_si256(t[i], k));
    }
    if (encrypt) {
        for (int r = 1; r < nr; r++) {
            k = _mm256_broadcastsi128_si256(rk[r]);
            for (int i = 0; i < 8; i++)
                b[i] = _mm256_aesenc_epi128(b[i], k);
        }
        k = _mm256_broadcastsi128_si256(rk[nr]);
        for (int i = 0; i < 8; i++)
            b[i] = _mm256_aesenclast_epi128(b[i], k);
    } else {
        for (int r = 1; r < nr; r++) {
            k = _mm256_broadcastsi128_si256(rk[r]);
            for (int i = 0; i < 8; i++)
                b[i] = _mm256_aesdec_epi128(b[i], k);
        }
        k = _mm256_broadcastsi128_si256(rk[nr]);
        for (int i = 0; i < 8; i++)
            b[i] = _mm256_aesdeclast_epi128(b[i], k);
    }
    for (int i = 0; i < 8; i++)
        _mm256_storeu_si256((__m256i *)dst + i, _mm256_xor_si256(b[i], t[i]));
}
