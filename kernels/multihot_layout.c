/*
 * multihot_layout.c - the shipped multihot layouts.
 *
 * NMMO3 (docs/nmmo3.md): an 11x15 map at the start of each 1707-byte
 * observation, 10 categorical features a tile with FACTORS one-hot slots each,
 * laid side by side into 59 channels.
 */
#include "gk.h"

const gk_multihot_layout gk_nmmo3_layout = {
    .height = 11,
    .width = 15,
    .nfeat = 10,
    .obs_offset = 0,
    .channels = 59,
    .slots = {4, 4, 17, 5, 3, 5, 5, 5, 7, 4},
    .offsets = {0, 4, 8, 25, 30, 33, 38, 43, 48, 55},
};
