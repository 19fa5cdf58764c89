/* statx of one path in a loop; prints the mean latency in nanoseconds.
 * Built by crates/fuse/tools/bench-uring (cc -O2). Usage: statx-loop PATH COUNT */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

int main(int argc, char **argv)
{
	struct statx sx;
	struct timespec start, end;
	long count, i;

	if (argc != 3)
		return 2;
	count = atol(argv[2]);
	if (statx(AT_FDCWD, argv[1], 0, STATX_BASIC_STATS, &sx) != 0) {
		perror(argv[1]);
		return 1;
	}
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (i = 0; i < count; i++)
		if (statx(AT_FDCWD, argv[1], 0, STATX_BASIC_STATS, &sx) != 0) {
			perror("statx");
			return 1;
		}
	clock_gettime(CLOCK_MONOTONIC, &end);
	printf("%.0f\n", ((end.tv_sec - start.tv_sec) * 1e9 +
			  (end.tv_nsec - start.tv_nsec)) / count);
	return 0;
}
