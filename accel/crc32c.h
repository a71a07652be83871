/* CRC32C fused with the copy of a block (crc32c.c). */
#ifndef SOFTHCA_ACCEL_CRC32C_H
#define SOFTHCA_ACCEL_CRC32C_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    size_t len, seg;              /* block bytes; the first two stretches' bytes */
    uint32_t shift_a, shift_b;    /* x^(8n-33) mod P, reflected, for each stretch's shift */
} crc32c_copy_t;

int crc32c_copy_available(void);
void crc32c_copy_setup(crc32c_copy_t *k, size_t len);
/* Copies len bytes and returns their CRC32C from register start ``reg``, final xor applied. */
uint32_t crc32c_copy(const crc32c_copy_t *k, uint32_t reg, uint8_t *dst, const uint8_t *src);
#endif
