/* Barrier storms: a region whose threads pass N barriers in a row, the
 * pattern of solvers that execute millions of barriers (between them each
 * thread here only counts, in a local variable: the figure is the team
 * barrier's own cost). Time per episode = time / N. Verified: every thread
 * counted N episodes (a reduction after the loop). */
#include "kernel.h"

int main(int argc, char **argv)
{
    static const long n_of_class[] = {20000, 200000, 1000000};
    int cls = kernel_class(argc, argv, "barrier");
    long n = n_of_class[cls];
    int threads = kernel_team_size();
    long total = 0;

    double t0 = omp_get_wtime();
#pragma omp parallel reduction(+ : total)
    {
        long mine = 0;
        for (long i = 0; i < n; i++) {
            mine += 1;
#pragma omp barrier
        }
        total += mine;
    }
    double seconds = omp_get_wtime() - t0;

    int ok = total == n * threads;
    char details[128];
    snprintf(details, sizeof details, "episodes=%ld us_per_episode=%.3f", n,
             seconds / n * 1e6);
    return kernel_report("barrier", cls, threads, seconds, ok, details);
}
