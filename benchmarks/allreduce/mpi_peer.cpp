// mpi_peer: Open MPI's MPI_Allreduce as a peer of allreduce_bench (see peer_process.h for the
// protocol). Started by the benchmark's rank 0 under `mpirun -np N ... mpi_peer DIR DTYPE`; each
// rank reads its commands from DIR/commands.<rank> (blocking: no MPI progress polling between
// sizes), rank 0 writes results to DIR/results. Rank r contributes r + i % 5 at element i; the
// first call is checked against the closed form. In place (MPI_IN_PLACE), float32/float64/int32/
// int64 sums. C++ for one reason: a size's time is the median of stats.h, as every contender's.
#include <mpi.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common/stats.h"

static void fill(void* buf, MPI_Datatype type, int rank, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    double v = rank + (double)(i % 5);
    if (type == MPI_FLOAT) ((float*)buf)[i] = (float)v;
    else if (type == MPI_DOUBLE) ((double*)buf)[i] = v;
    else if (type == MPI_INT32_T) ((int32_t*)buf)[i] = (int32_t)v;
    else ((int64_t*)buf)[i] = (int64_t)v;
  }
}

static long countWrong(const void* buf, MPI_Datatype type, int world, size_t count) {
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double want = world * (world - 1) / 2.0 + world * (double)(i % 5), got;
    if (type == MPI_FLOAT) got = ((const float*)buf)[i];
    else if (type == MPI_DOUBLE) got = ((const double*)buf)[i];
    else if (type == MPI_INT32_T) got = ((const int32_t*)buf)[i];
    else got = (double)((const int64_t*)buf)[i];
    if (got != want) ++wrong;
  }
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 3) {
    fprintf(stderr, "usage: mpi_peer DIR DTYPE\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Datatype type = MPI_FLOAT;
  size_t elem = 4;
  if (strcmp(argv[2], "float64") == 0) {
    type = MPI_DOUBLE;
    elem = 8;
  } else if (strcmp(argv[2], "int32") == 0) {
    type = MPI_INT32_T;
    elem = 4;
  } else if (strcmp(argv[2], "int64") == 0) {
    type = MPI_INT64_T;
    elem = 8;
  } else if (strcmp(argv[2], "float32") != 0) {
    fprintf(stderr, "mpi_peer: no MPI type for %s\n", argv[2]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/commands.%d", argv[1], rank);
  FILE* commands = fopen(path, "r");
  FILE* results = NULL;
  if (rank == 0) {
    snprintf(path, sizeof(path), "%s/results", argv[1]);
    results = fopen(path, "w");
  }
  if (!commands || (rank == 0 && !results)) MPI_Abort(MPI_COMM_WORLD, 1);
  void* buf = NULL;
  size_t capacity = 0;
  char line[256];
  std::vector<double> times;
  while (fgets(line, sizeof(line), commands)) {
    size_t bytes = 0;
    int warmup = 0, iters = 0;
    if (sscanf(line, "run %zu %d %d", &bytes, &warmup, &iters) != 3) break;
    const size_t count = bytes / elem;
    if (bytes > capacity) {
      free(buf);
      buf = malloc(bytes);
      memset(buf, 0, bytes);  // first touch here, not in the timed loop
      capacity = bytes;
    }
    fill(buf, type, rank, count);
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
    const long wrong = countWrong(buf, type, world, count);
    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    times.clear();
    for (int i = 0; i < iters; ++i) {
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, type, MPI_SUM, MPI_COMM_WORLD);
      times.push_back((MPI_Wtime() - t0) * 1e6);
    }
    if (rank == 0) {
      fprintf(results, "%zu %.3f %ld\n", bytes, dtrain::bench::median(times), wrong);
      fflush(results);
    }
  }
  free(buf);
  MPI_Finalize();
  return 0;
}
