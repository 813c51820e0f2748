/*
 * The step, the end and the closing fold of the lanes of the lane-tile GEMMs
 * (gemm_bf16w_tiles: gemm_avx2.c's lt_ kernels, gemm_avx512.c's z_ kernels), written once over
 * the including file's vector mapping: lv (its fp32 vector), lv_fmadd, lv_add, lv_broadcast(p)
 * (the float at p in every lane) and LANE_NR (the weight rows of its register block). In
 * both, a lane's accumulators are acc[j][h]: weight row j of the panel against row vector h
 * of the tile (H of them, 1 or 2); the chains are pair32's (kernels.h), in its order.
 */
#ifndef PARITY_LANE_TILES_H
#define PARITY_LANE_TILES_H

#include <stddef.h>

#include "kernels_x86.h"

/* One step of a lane: for the LANE_NR weights, the float at b + j * stride + at broadcast,
 * acc[j][h] = fma(x[h], weight j, acc[j][h]). */
ALWAYS_INLINE void lane_step(const int H, const lv x[2], const float *b, size_t stride, int at,
                             lv acc[LANE_NR][2]) {
#pragma GCC unroll 8
    for (int j = 0; j < LANE_NR; j++) {
        const lv bj = lv_broadcast(b + j * stride + at);
        acc[j][0] = lv_fmadd(x[0], bj, acc[j][0]);
        if (H > 1) acc[j][1] = lv_fmadd(x[1], bj, acc[j][1]);
    }
}

/* The end of a lane's run: its chains go to out, or, where `fold` is given (lanes 8-15, at the
 * end of K), the dot16 fold's first step is taken on the way: fold (lane l - 8, finished
 * before) becomes fold + these chains. */
ALWAYS_INLINE void lane_end(const int H, lv acc[LANE_NR][2], lv out[LANE_NR][2],
                            lv fold[LANE_NR][2]) {
#pragma GCC unroll 8
    for (int j = 0; j < LANE_NR; j++)
        for (int h = 0; h < H; h++)
            if (fold) fold[j][h] = lv_add(fold[j][h], acc[j][h]);
            else out[j][h] = acc[j][h];
}

/* The rest of the dot16 fold across a tile's 16 lanes (l += l + 8 was taken as lanes 8-15
 * ended): l += l + 4, + 2, + 1; lanes[0] then holds the outputs. */
ALWAYS_INLINE void lanes_fold(const int H, lv lanes[16][LANE_NR][2]) {
    for (size_t step = 4; step >= 1; step /= 2)
        for (size_t l = 0; l < step; l++)
            for (int j = 0; j < LANE_NR; j++)
                for (int h = 0; h < H; h++)
                    lanes[l][j][h] = lv_add(lanes[l][j][h], lanes[l + step][j][h]);
}

#endif /* PARITY_LANE_TILES_H */
