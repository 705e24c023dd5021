// ds/rng.h: the counter-based random numbers of sampling and acceptance, host and device.
//
// A draw is a pure function of (seed, request, position, lane): no generator state, so a
// sequence's draws never depend on the batch it sits in, the order rows are processed in, or
// whether the CPU or the GPU draws them (DESIGN §5). `request` numbers the conversation turn of a
// run (0 for a single prompt), `position` is the absolute token position the draw decides, and
// `lane` separates the independent draws made at one position (enum ds_rng_lane).
//
// The hash is splitmix64's finaliser (Steele, Lea, Flood 2014; Vigna's reference splitmix64.c)
// applied in a chain: h = mix(mix(mix(mix(seed) ^ request) ^ position) ^ lane), where mix(z) is one
// splitmix64 step from state z (ds_rng_mix(0) = 0xe220a8397b1dcdaf, its first output from 0).
#ifndef DS_RNG_H
#define DS_RNG_H

#include <stdint.h>

#include "ds/hd.h"

// Independent draws at one position.
enum ds_rng_lane {
    DS_RNG_LANE_SAMPLE = 0,   // sampling the emitted token from p (plain decoding, the bonus)
    DS_RNG_LANE_ACCEPT = 1,   // the acceptance coin of a drafted token
    DS_RNG_LANE_RESIDUAL = 2, // sampling the correction token after a rejection
    DS_RNG_LANE_DRAFT = 3,    // the draft's own sample (rejection sampling with a sampled draft)
};

// One splitmix64 step from state z: the output after adding the golden-ratio increment.
DS_HD uint64_t ds_rng_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// 64 random bits for (seed, request, position, lane).
DS_HD uint64_t ds_rng_u64(uint64_t seed, uint64_t request, uint64_t position, uint32_t lane) {
    uint64_t h = ds_rng_mix(seed);
    h = ds_rng_mix(h ^ request);
    h = ds_rng_mix(h ^ position);
    return ds_rng_mix(h ^ (uint64_t)lane);
}

// Uniform in [0, 1) with 53 random bits (exact multiples of 2^-53).
DS_HD double ds_rng_uniform(uint64_t seed, uint64_t request, uint64_t position, uint32_t lane) {
    return (double)(ds_rng_u64(seed, request, position, lane) >> 11) * 0x1p-53;
}

#endif // DS_RNG_H
