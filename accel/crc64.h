/* CRC-64/NVME for the CRC64_XP10 guard (crc64.c). */
#ifndef SOFTHCA_ACCEL_CRC64_H
#define SOFTHCA_ACCEL_CRC64_H
#include <stddef.h>
#include <stdint.h>
void crc64_setup(void);
int crc64_clmul_available(void);
/* Register start ``reg``; the final xor applied. */
uint64_t crc64_nvme(uint64_t reg, const uint8_t *p, size_t len);
/* The same by the table alone, as on a CPU without PCLMULQDQ. */
uint64_t crc64_nvme_table(uint64_t reg, const uint8_t *p, size_t len);
#endif
