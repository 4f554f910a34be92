/* Shared by the benchmark kernels of tests/c/bench/: the size class from
 * the command line and the one result line every kernel prints.
 *
 * A kernel is run as `./kernel [CLASS]` with CLASS one of S, W, A (default
 * S). It prints exactly one line on stdout:
 *
 *   result kernel=<name> class=<C> threads=<team size> time=<s> verified=yes|no <details>
 *
 * where time is the kernel's own omp_get_wtime() measurement of its timed
 * part (set-up and verification excluded) and threads the size of the team
 * that ran it; it exits with status 1 if the verification failed, 2 on a
 * bad argument. */
#ifndef KERNEL_H
#define KERNEL_H

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The size class: 0 = S, 1 = W, 2 = A. Exits with status 2 (and a usage
 * message on stderr) on anything else. */
static int kernel_class(int argc, char **argv, const char *name)
{
    const char *c = argc > 1 ? argv[1] : "S";
    if (argc <= 2) {
        if (strcmp(c, "S") == 0)
            return 0;
        if (strcmp(c, "W") == 0)
            return 1;
        if (strcmp(c, "A") == 0)
            return 2;
    }
    fprintf(stderr, "usage: %s [S|W|A]\n", name);
    exit(2);
}

static const char kernel_class_names[] = "SWA";

/* The number of threads of a team started here. */
static int kernel_team_size(void)
{
    int n = 0;
#pragma omp parallel
    {
#pragma omp single
        n = omp_get_num_threads();
    }
    return n;
}

/* Prints the result line (details: extra `key=value` words, may be "")
 * and returns main's exit status. */
static int kernel_report(const char *name, int cls, int threads,
                         double seconds, int verified, const char *details)
{
    printf("result kernel=%s class=%c threads=%d time=%.6f verified=%s%s%s\n",
           name, kernel_class_names[cls], threads, seconds,
           verified ? "yes" : "no", details[0] ? " " : "", details);
    fflush(stdout);
    return verified ? 0 : 1;
}

#endif
