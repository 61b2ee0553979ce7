/* visualize.c — describe a sharding in text: the type, a grid showing which
 * ranks hold each block of a 1-D or 2-D tensor (as jax.debug.
 * visualize_array_sharding does), and every rank's shard: its mesh
 * coordinates, global index ranges and local shape.  Needs only a layout, so
 * `shard inspect spec` runs without starting ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_impl.h"
#include "shard/spec.h"

/* The ranks holding block (i, j): "0,1", "0-3" style (the communicator's rank-list format). */
static void ranks_of_block(const shard_spec *spec, const shard_mesh_layout *l, int bi, int bj, char *out,
                           size_t bytes) {
    int world = shard_mesh_layout_world(l);
    int *hold = calloc((size_t)world, sizeof *hold);
    if (!hold) {
        snprintf(out, bytes, "?");
        return;
    }
    for (int r = 0; r < world; r++) {
        int coords[SHARD_MESH_MAX_AXES];
        shard_mesh_layout_unravel(l, ~0u, r, coords);
        int i = spec->ndim > 0 ? shard_spec_piece_index(spec, l, 0, coords) : 0;
        int j = spec->ndim > 1 ? shard_spec_piece_index(spec, l, 1, coords) : 0;
        hold[r] = i == bi && j == bj;
    }
    shard__format_rank_list(hold, world, out, bytes);
    free(hold);
}

/* The range of piece `index` along dim `dim` (nested over the dim's axes, see spec.h). */
static void range_text(const shard_spec *spec, const shard_mesh_layout *l, const size_t *shape, int dim, int index,
                       char *out, size_t bytes) {
    int coords[SHARD_MESH_MAX_AXES] = {0};
    for (int i = spec->naxes[dim] - 1; i >= 0; i--) { /* the piece index read row-major over the dim's axes */
        int k = spec->axes[dim][i];
        coords[k] = index % l->sizes[k];
        index /= l->sizes[k];
    }
    size_t off, len;
    shard_spec_local_range(spec, l, shape, coords, dim, &off, &len);
    snprintf(out, bytes, "%zu:%zu", off, off + len);
}

void shard_spec_describe(const shard_spec *spec, const shard_mesh_layout *l, shard_dtype dtype, const size_t *shape,
                         FILE *to) {
    char text[256];
    int world = shard_mesh_layout_world(l);
    fprintf(to, "mesh  ");
    for (int k = 0; k < l->ndim; k++) fprintf(to, "%s%s=%d", k ? "," : "", l->names[k], l->sizes[k]);
    shard_spec_string(spec, l, text, sizeof text);
    fprintf(to, " (%d ranks, row-major, last axis fastest)\nspec  %s\n", world, text);
    shard_spec_type_string(spec, l, dtype, shape, text, sizeof text);
    fprintf(to, "type  %s\n", text);
    int rows = spec->ndim == 2 ? shard_spec_pieces(spec, l, 0) : 1;
    int cols = spec->ndim == 1 || spec->ndim == 2 ? shard_spec_pieces(spec, l, spec->ndim - 1) : 1;
    /* each block's holders take a pass over every rank: past 2^24 rank visits (a second or so) the grid is left out */
    if ((spec->ndim == 1 || spec->ndim == 2) && (double)rows * cols * world > (double)(1 << 24))
        fprintf(to, "\n(the grid of which ranks hold each block is left out: %d blocks x %d ranks)\n", rows * cols,
                world);
    else if (spec->ndim == 1 || spec->ndim == 2) {
        fprintf(to, "\nwhich ranks hold each block (%s):\n", spec->ndim == 2 ? "rows x columns" : "elements");
        enum { W = 14 };
        fprintf(to, "%*s", W, "");
        for (int j = 0; j < cols; j++) {
            range_text(spec, l, shape, spec->ndim - 1, j, text, sizeof text);
            fprintf(to, " %-*s", W, text);
        }
        fprintf(to, "\n");
        for (int i = 0; i < rows; i++) {
            if (spec->ndim == 2)
                range_text(spec, l, shape, 0, i, text, sizeof text);
            else
                snprintf(text, sizeof text, "ranks");
            fprintf(to, "%-*s", W, text);
            for (int j = 0; j < cols; j++) {
                ranks_of_block(spec, l, spec->ndim == 2 ? i : j, spec->ndim == 2 ? j : 0, text, sizeof text);
                fprintf(to, " %-*s", W, text);
            }
            fprintf(to, "\n");
        }
    }
    fprintf(to, "\nshards (rank, coordinates, global index ranges, local shape):\n");
    for (int r = 0; r < world; r++) {
        int coords[SHARD_MESH_MAX_AXES];
        shard_mesh_layout_unravel(l, ~0u, r, coords);
        fprintf(to, "  rank %-3d (", r);
        for (int k = 0; k < l->ndim; k++) fprintf(to, "%s%s=%d", k ? "," : "", l->names[k], coords[k]);
        fprintf(to, ")  [");
        size_t local[SHARD_MAX_DIMS];
        for (int d = 0; d < spec->ndim; d++) {
            size_t off, len;
            shard_spec_local_range(spec, l, shape, coords, d, &off, &len);
            local[d] = len;
            fprintf(to, "%s%zu:%zu", d ? ", " : "", off, off + len);
        }
        fprintf(to, "]  local %s[", shard_dtype_name(dtype));
        for (int d = 0; d < spec->ndim; d++) fprintf(to, "%s%zu", d ? "," : "", local[d]);
        fprintf(to, "]\n");
    }
}
