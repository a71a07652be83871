/* What the check programs (mpcheck.c, wirecheck.c) share: reading the hex their driving
 * tests write. */
#ifndef SOFTHCA_TESTS_HEX_H
#define SOFTHCA_TESTS_HEX_H

/* A lower-case hex digit's value, -1 for any other character. */
static inline int hex_nibble(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

#endif
