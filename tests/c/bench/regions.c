/* Many short parallel regions: each region's threads add to a reduction
 * variable in main's frame and write one element of a heap array that
 * main allocated, and main reads them after the region — the pattern of
 * codes that open a region per loop nest. Time per region = time / N.
 * Verified: the reduction and the array hold every region's values. */
#include "kernel.h"

int main(int argc, char **argv)
{
    static const long n_of_class[] = {2000, 20000, 100000};
    int cls = kernel_class(argc, argv, "regions");
    long n = n_of_class[cls];
    int threads = kernel_team_size();
    long *last = calloc((size_t)threads, sizeof *last);
    long sum = 0;
    int ok = 1;

    double t0 = omp_get_wtime();
    for (long r = 0; r < n; r++) {
#pragma omp parallel reduction(+ : sum)
        {
            int me = omp_get_thread_num();
            last[me] = r;
            sum += me + 1;
        }
        ok = ok && last[r % threads] == r;
    }
    double seconds = omp_get_wtime() - t0;

    ok = ok && sum == n * (long)threads * (threads + 1) / 2;
    char details[128];
    snprintf(details, sizeof details, "regions=%ld us_per_region=%.3f", n, seconds / n * 1e6);
    free(last);
    return kernel_report("regions", cls, threads, seconds, ok, details);
}
