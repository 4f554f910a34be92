/* IS-like kernel (the integer sort of the NAS Parallel Benchmarks): ranks
 * 2^NB integer keys in [0, 2^KB) by a bucketed counting sort, `iters`
 * times, changing two keys before each ranking as NPB IS does.
 *
 * The keys come from the linear congruential generator x' = 5^13 x mod
 * 2^46 (seed 314159265): a key is 2^KB / 4 times the sum of four uniform
 * numbers, so they bunch in the middle of the range. Every ranking is one
 * parallel region, shaped like the bucket version of the OpenMP IS codes:
 * each thread counts its static share of the keys into its own row of a
 * (threads x buckets) histogram; after the barrier every thread works out,
 * from all the rows, where its keys of each bucket go, and scatters its
 * share (the same static schedule) into the bucketed array; then the
 * buckets are shared out by a dynamic `for`, each counting its keys into
 * the global key histogram and turning it into cumulative counts (the rank
 * of key k is the count of keys below it). Before the region, the ranks of
 * five test keys of the previous ranking are read (the partial
 * verification's values).
 *
 * Verified after the timed part: the last ranking's cumulative counts must
 * equal a serial histogram of the keys exactly; the bucketed keys, placed
 * by those counts, must fill every slot, be sorted and have the original
 * keys' checksum (sum and sum of squares); and every iteration's test ranks
 * must equal serial counts on the keys of that iteration.
 *
 * Classes: S 2^22 keys < 2^18 with 10 iterations (NPB's count), W 2^24
 * keys < 2^20 with 20, A 2^25 keys < 2^21 with 20. */
#include "kernel.h"

#define MAXITERS 20
#define NTEST 5
#define LOG_BUCKETS 10
#define BUCKETS (1 << LOG_BUCKETS)
#define MASK46 ((1ULL << 46) - 1)
#define MASK23 ((1ULL << 23) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 314159265ULL

/* a * x mod 2^46, for a, x < 2^46. */
static inline unsigned long long mul46(unsigned long long a,
                                       unsigned long long x)
{
    unsigned long long a1 = a >> 23, a2 = a & MASK23;
    unsigned long long x1 = x >> 23, x2 = x & MASK23;
    unsigned long long mid = (a1 * x2 + a2 * x1) & MASK23;
    return ((mid << 23) + a2 * x2) & MASK46;
}

static long nkeys;
static int max_key, shift, iters;
static int *key_array, *key_buff1, *key_buff2;
static int *bucket_size, *bucket_ptrs; /* threads x BUCKETS */
static long test_index[NTEST];
static int test_value[MAXITERS + 1][NTEST];
static long test_rank[MAXITERS + 1][NTEST];

static void create_keys(void)
{
    const double scale = 1.0 / (double)(1ULL << 46);
    unsigned long long x = SEED;
    for (long i = 0; i < nkeys; i++) {
        double s = 0;
        for (int r = 0; r < 4; r++) {
            x = mul46(MULT, x);
            s += (double)x * scale;
        }
        key_array[i] = (int)(s * (max_key / 4));
    }
}

/* Ranking number `it` (1 .. iters). */
static void rank(int it)
{
    key_array[it] = it;
    key_array[it + iters] = max_key - it;
    for (int t = 0; t < NTEST; t++)
        test_value[it][t] = key_array[test_index[t]];

#pragma omp parallel
    {
        int me = omp_get_thread_num(), nt = omp_get_num_threads();
        int *mine = bucket_size + (long)me * BUCKETS;
        int *ptr = bucket_ptrs + (long)me * BUCKETS;
        for (int b = 0; b < BUCKETS; b++)
            mine[b] = 0;

#pragma omp for schedule(static)
        for (long i = 0; i < nkeys; i++)
            mine[key_array[i] >> shift]++;

        /* Where this thread's keys of bucket b start: after every key of
         * the buckets below b and the keys of b of the threads below me. */
        int run = 0;
        for (int b = 0; b < BUCKETS; b++) {
            for (int t = 0; t < me; t++)
                run += bucket_size[(long)t * BUCKETS + b];
            ptr[b] = run;
            for (int t = me; t < nt; t++)
                run += bucket_size[(long)t * BUCKETS + b];
        }

        /* The same static schedule: the keys this thread counted. */
#pragma omp for schedule(static)
        for (long i = 0; i < nkeys; i++) {
            int k = key_array[i];
            key_buff2[ptr[k >> shift]++] = k;
        }

        /* The last thread's pointers now end the buckets. */
        const int *end = bucket_ptrs + (long)(nt - 1) * BUCKETS;
#pragma omp for schedule(dynamic)
        for (int b = 0; b < BUCKETS; b++) {
            int lo = b << shift, hi = (b + 1) << shift;
            int start = b == 0 ? 0 : end[b - 1];
            for (int k = lo; k < hi; k++)
                key_buff1[k] = 0;
            for (long i = start; i < end[b]; i++)
                key_buff1[key_buff2[i]]++;
            /* Cumulative: key_buff1[k] = keys <= k. */
            int c = start;
            for (int k = lo; k < hi; k++) {
                c += key_buff1[k];
                key_buff1[k] = c;
            }
        }
    }

    for (int t = 0; t < NTEST; t++) {
        int v = test_value[it][t];
        test_rank[it][t] = v == 0 ? 0 : key_buff1[v - 1];
    }
}

int main(int argc, char **argv)
{
    static const int nb_of_class[] = {22, 24, 25};
    static const int kb_of_class[] = {18, 20, 21};
    static const int iters_of_class[] = {10, 20, 20};
    int cls = kernel_class(argc, argv, "is");
    nkeys = 1L << nb_of_class[cls];
    max_key = 1 << kb_of_class[cls];
    shift = kb_of_class[cls] - LOG_BUCKETS;
    iters = iters_of_class[cls];
    int threads = kernel_team_size();

    key_array = malloc(nkeys * sizeof *key_array);
    key_buff2 = malloc(nkeys * sizeof *key_buff2);
    key_buff1 = malloc((size_t)max_key * sizeof *key_buff1);
    bucket_size = malloc((size_t)threads * BUCKETS * sizeof *bucket_size);
    bucket_ptrs = malloc((size_t)threads * BUCKETS * sizeof *bucket_ptrs);
    for (int t = 0; t < NTEST; t++)
        test_index[t] = (nkeys / NTEST) * t + 12345 * (t + 1);
    create_keys();
    int *orig = malloc(nkeys * sizeof *orig);
    memcpy(orig, key_array, nkeys * sizeof *orig);

    double t0 = omp_get_wtime();
    for (int it = 1; it <= iters; it++)
        rank(it);
    double seconds = omp_get_wtime() - t0;

    /* Test ranks: the keys of iteration `it` are the original ones with
     * the changes of iterations 1 .. it. */
    long wrong_ranks = 0, rank_sum = 0;
    for (int it = 1; it <= iters; it++) {
        orig[it] = it;
        orig[it + iters] = max_key - it;
        for (int t = 0; t < NTEST; t++) {
            long below = 0;
            for (long i = 0; i < nkeys; i++)
                below += orig[i] < test_value[it][t];
            wrong_ranks += below != test_rank[it][t];
            rank_sum += test_rank[it][t];
        }
    }
    /* The last ranking's cumulative counts. */
    int *count = calloc((size_t)max_key, sizeof *count);
    unsigned long long sum = 0, sum2 = 0;
    for (long i = 0; i < nkeys; i++) {
        count[key_array[i]]++;
        sum += (unsigned long long)key_array[i];
        sum2 += (unsigned long long)key_array[i] * (unsigned long long)key_array[i];
    }
    long wrong_counts = 0;
    int c = 0;
    for (int k = 0; k < max_key; k++) {
        c += count[k];
        wrong_counts += c != key_buff1[k];
    }
    /* Place the bucketed keys by their ranks. */
    int *sorted = malloc(nkeys * sizeof *sorted);
    for (long i = 0; i < nkeys; i++)
        sorted[i] = -1;
    long misplaced = 0;
    for (long i = 0; i < nkeys; i++) {
        int k = key_buff2[i];
        if (k < 0 || k >= max_key || key_buff1[k] <= 0 || key_buff1[k] > nkeys) {
            misplaced++;
            continue;
        }
        sorted[--key_buff1[k]] = k;
    }
    unsigned long long ssum = 0, ssum2 = 0;
    for (long i = 0; i < nkeys; i++) {
        misplaced += sorted[i] < 0 || (i > 0 && sorted[i] < sorted[i - 1]);
        if (sorted[i] >= 0) {
            ssum += (unsigned long long)sorted[i];
            ssum2 += (unsigned long long)sorted[i] * (unsigned long long)sorted[i];
        }
    }
    int ok = wrong_ranks == 0 && wrong_counts == 0 && misplaced == 0 &&
             ssum == sum && ssum2 == sum2;

    char details[256];
    snprintf(details, sizeof details,
             "keys=%ld max_key=%d iters=%d rank_sum=%ld checksum=%llu "
             "wrong_ranks=%ld wrong_counts=%ld misplaced=%ld",
             nkeys, max_key, iters, rank_sum, sum, wrong_ranks, wrong_counts,
             misplaced);
    free(key_array);
    free(key_buff1);
    free(key_buff2);
    free(bucket_size);
    free(bucket_ptrs);
    free(orig);
    free(count);
    free(sorted);
    return kernel_report("is", cls, threads, seconds, ok, details);
}
