/* A libiscsi initiator of ours (tests/native/test_iser.py): logs in to URL (iser:// for
 * iSER), writes SIZE_MIB MiB of a pattern from LBA 0 in WRITE(16)s, reads it back in
 * READ(16)s and compares every block with the pattern computed anew. Prints its figures
 * and a verdict line ("compare ok: ..." or "compare FAILED: ...").
 *
 *   iscsicheck INITIATOR-IQN URL SIZE_MIB [CHUNK_KIB]   (256 KiB per command unless
 *                                                      given)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>

#define BLOCK 512
static uint32_t CHUNK = 256 * 1024;

/* Block ``lba``'s bytes: its LBA (8 bytes, little-endian), then a byte sequence that
 * starts from the LBA, so no two blocks are alike and no block is zeros. */
static void pattern(uint64_t lba, unsigned char *b)
{
	int i;

	for (i = 0; i < 8; i++)
		b[i] = (unsigned char)(lba >> (8 * i));
	for (i = 8; i < BLOCK; i++)
		b[i] = (unsigned char)(lba * 7 + i * 13 + 1);
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	struct iscsi_context *iscsi;
	struct iscsi_url *url;
	struct scsi_task *task;
	unsigned char *buf, want[BLOCK];
	uint64_t blocks, lba, bad = 0, first_bad = 0;
	double t0, tw, tr;
	uint32_t i, n;

	if (argc != 4 && argc != 5) {
		fprintf(stderr, "usage: iscsicheck INITIATOR-IQN URL SIZE_MIB [CHUNK_KIB]\n");
		return 2;
	}
	if (argc == 5)
		CHUNK = (uint32_t)atoi(argv[4]) * 1024;
	if (CHUNK < BLOCK || CHUNK % BLOCK) {
		fprintf(stderr, "iscsicheck: CHUNK_KIB must be a whole number of blocks\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	blocks = (uint64_t)atoi(argv[3]) * 1024 * 1024 / BLOCK;
	buf = malloc(CHUNK);
	iscsi = iscsi_create_context(argv[1]);
	if (!buf || !iscsi) {
		printf("FAIL no memory\n");
		return 1;
	}
	url = iscsi_parse_full_url(iscsi, argv[2]);
	if (!url) {
		printf("FAIL url: %s\n", iscsi_get_error(iscsi));
		return 1;
	}
	iscsi_set_targetname(iscsi, url->target);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun)) {
		printf("FAIL login: %s\n", iscsi_get_error(iscsi));
		return 1;
	}
	printf("logged in to %s lun %d\n", url->target, url->lun);
	t0 = now();
	for (lba = 0; lba < blocks; lba += n) {
		n = blocks - lba < CHUNK / BLOCK ? (uint32_t)(blocks - lba) : CHUNK / BLOCK;
		for (i = 0; i < n; i++)
			pattern(lba + i, buf + (size_t)i * BLOCK);
		task = iscsi_write16_sync(iscsi, url->lun, lba, buf, n * BLOCK, BLOCK, 0, 0, 0,
					  0, 0);
		if (!task || task->status != SCSI_STATUS_GOOD) {
			printf("FAIL WRITE(16) at lba %llu: %s\n", (unsigned long long)lba,
			       iscsi_get_error(iscsi));
			return 1;
		}
		scsi_free_scsi_task(task);
	}
	tw = now() - t0;
	printf("wrote %llu bytes in %.2f s (%.1f MB/s)\n",
	       (unsigned long long)blocks * BLOCK, tw, blocks * BLOCK / tw / 1e6);
	t0 = now();
	for (lba = 0; lba < blocks; lba += n) {
		n = blocks - lba < CHUNK / BLOCK ? (uint32_t)(blocks - lba) : CHUNK / BLOCK;
		task = iscsi_read16_sync(iscsi, url->lun, lba, n * BLOCK, BLOCK, 0, 0, 0, 0, 0);
		if (!task || task->status != SCSI_STATUS_GOOD ||
		    task->datain.size != (int)(n * BLOCK)) {
			printf("FAIL READ(16) at lba %llu: %s\n", (unsigned long long)lba,
			       iscsi_get_error(iscsi));
			return 1;
		}
		for (i = 0; i < n; i++) {
			pattern(lba + i, want);
			if (memcmp(want, task->datain.data + (size_t)i * BLOCK, BLOCK) && !bad++)
				first_bad = lba + i;
		}
		scsi_free_scsi_task(task);
	}
	tr = now() - t0;
	printf("read %llu bytes in %.2f s (%.1f MB/s)\n",
	       (unsigned long long)blocks * BLOCK, tr, blocks * BLOCK / tr / 1e6);
	if (bad)
		printf("compare FAILED: %llu of %llu blocks differ, the first at lba %llu\n",
		       (unsigned long long)bad, (unsigned long long)blocks,
		       (unsigned long long)first_bad);
	else
		printf("compare ok: %llu blocks of %d bytes as written\n",
		       (unsigned long long)blocks, BLOCK);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	free(buf);
	return bad ? 1 : 0;
}
