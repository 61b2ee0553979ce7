/* spec.c — parse, print and apply sharding specs (see spec.h for the text form
 * and the split rule).  A small recursive-descent parser over:
 *   spec    := 'P' '(' [item {',' item}] ')'
 *   item    := entry | 'partial' '=' axes | 'partial_op' '=' string
 *   entry   := 'None' | string | '(' [string {',' string}] [','] ')'
 *   axes    := string | '(' string {',' string} [','] ')'
 *   string  := quoted with ' or "                                            */
#include "shard/spec.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------- layouts */

shard_status shard_mesh_layout_parse(const char *text, int world_size, shard_mesh_layout *out) {
    if (!out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_mesh_layout_parse: out is NULL");
    memset(out, 0, sizeof *out);
    int n = shard_mesh_parse(text, world_size, out->names, out->sizes);
    if (n < 0) return (shard_status)n;
    out->ndim = n;
    return SHARD_OK;
}

void shard_mesh_layout_of(const shard_mesh *mesh, shard_mesh_layout *out) {
    memset(out, 0, sizeof *out);
    out->ndim = shard_mesh_ndim(mesh);
    for (int k = 0; k < out->ndim; k++) {
        snprintf(out->names[k], sizeof out->names[k], "%s", shard_mesh_axis_name(mesh, k));
        out->sizes[k] = shard_mesh_axis_size(mesh, k);
    }
}

int shard_mesh_layout_world(const shard_mesh_layout *layout) {
    int n = 1;
    for (int k = 0; k < layout->ndim; k++) n *= layout->sizes[k];
    return n;
}

void shard_mesh_layout_unravel(const shard_mesh_layout *layout, unsigned axes_mask, int index, int *coords) {
    for (int k = layout->ndim - 1; k >= 0; k--)
        if (axes_mask & (1u << k)) {
            coords[k] = index % layout->sizes[k];
            index /= layout->sizes[k];
        }
}

/* ---------------------------------------------------------------- parser */

typedef struct parser {
    const char *text, *p;
    const shard_mesh_layout *layout;
    shard_spec *spec;
    unsigned split;   /* mesh axes splitting some dim */
    unsigned partial; /* mesh axes the tensor is partial over */
    int in_partial;   /* parsing the partial= keyword */
} parser;

static void skip_space(parser *ps) {
    while (isspace((unsigned char)*ps->p)) ps->p++;
}

static shard_status fail(parser *ps, const char *fmt, const char *detail) {
    char what[480];
    snprintf(what, sizeof what, fmt, detail ? detail : "");
    return shard_error(SHARD_ERR_INVALID_ARG, "spec %s: %s (at column %d)", ps->text, what,
                       (int)(ps->p - ps->text) + 1);
}

static int accept(parser *ps, const char *token) {
    skip_space(ps);
    size_t n = strlen(token);
    if (strncmp(ps->p, token, n) != 0) return 0;
    if (isalpha((unsigned char)token[0]) && (isalnum((unsigned char)ps->p[n]) || ps->p[n] == '_')) return 0;
    ps->p += n;
    return 1;
}

static shard_status parse_string(parser *ps, char *out, size_t out_bytes) {
    skip_space(ps);
    char quote = *ps->p;
    if (quote != '\'' && quote != '"') return fail(ps, "expected a quoted axis name, None or (", NULL);
    const char *start = ++ps->p;
    while (*ps->p && *ps->p != quote) ps->p++;
    if (!*ps->p) return fail(ps, "unterminated string", NULL);
    size_t len = (size_t)(ps->p - start);
    ps->p++;
    if (len >= out_bytes) return fail(ps, "axis name too long", NULL);
    memcpy(out, start, len);
    out[len] = '\0';
    return SHARD_OK;
}

/* A quoted mesh axis: its index, marked used; errors name the mesh's axes. */
static shard_status parse_axis(parser *ps, int *axis) {
    char name[SHARD_MESH_AXIS_NAME_BYTES];
    SHARD_CHECK(parse_string(ps, name, sizeof name));
    for (int k = 0; k < ps->layout->ndim; k++)
        if (strcmp(ps->layout->names[k], name) == 0) {
            if (ps->in_partial && (ps->split & (1u << k)))
                return fail(ps,
                            "axis '%s' both splits a dim and is partial; a tensor is partial only over axes that do "
                            "not split it",
                            name);
            if ((ps->split | ps->partial) & (1u << k)) return fail(ps, "axis '%s' is used twice", name);
            *(ps->in_partial ? &ps->partial : &ps->split) |= 1u << k;
            *axis = k;
            return SHARD_OK;
        }
    char known[256] = "";
    size_t used = 0;
    for (int k = 0; k < ps->layout->ndim && used < sizeof known; k++)
        used += (size_t)snprintf(known + used, sizeof known - used, "%s%s", k ? ", " : "", ps->layout->names[k]);
    char detail[300];
    snprintf(detail, sizeof detail, "'%s'; the mesh's axes are %.240s", name, known);
    return fail(ps, "unknown axis %s", detail);
}

/* One axis, or a parenthesised tuple of axes; stores them in order. */
static shard_status parse_axes(parser *ps, int8_t *axes, int *naxes, int allow_empty) {
    *naxes = 0;
    if (!accept(ps, "(")) {
        int k;
        SHARD_CHECK(parse_axis(ps, &k));
        axes[(*naxes)++] = (int8_t)k;
        return SHARD_OK;
    }
    while (!accept(ps, ")")) {
        if (*naxes && !accept(ps, ",")) return fail(ps, "expected ',' or ')' in a tuple of axes", NULL);
        if (accept(ps, ")")) break; /* trailing comma */
        int k;
        SHARD_CHECK(parse_axis(ps, &k));
        axes[(*naxes)++] = (int8_t)k;
    }
    if (!*naxes && !allow_empty) return fail(ps, "empty tuple of axes", NULL);
    return SHARD_OK;
}

shard_spec shard_spec_replicated(int ndim) {
    shard_spec s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    s.partial_op = SHARD_OP_SUM;
    return s;
}

int shard_spec_equal(const shard_spec *a, const shard_spec *b) {
    if (a->ndim != b->ndim || a->partial_mask != b->partial_mask) return 0;
    if (a->partial_mask && a->partial_op != b->partial_op) return 0;
    for (int d = 0; d < a->ndim; d++) {
        if (a->naxes[d] != b->naxes[d]) return 0;
        for (int i = 0; i < a->naxes[d]; i++)
            if (a->axes[d][i] != b->axes[d][i]) return 0;
    }
    return 1;
}

unsigned shard_spec_split_axes(const shard_spec *spec) {
    unsigned mask = 0;
    for (int d = 0; d < spec->ndim; d++)
        for (int i = 0; i < spec->naxes[d]; i++) mask |= 1u << spec->axes[d][i];
    return mask;
}

shard_status shard_spec_parse(const char *text, const shard_mesh_layout *layout, int tensor_ndim, shard_spec *out) {
    if (!text || !layout || !out) return shard_error(SHARD_ERR_INVALID_ARG, "shard_spec_parse: NULL argument");
    if (tensor_ndim < 0 || tensor_ndim > SHARD_MAX_DIMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "shard_spec_parse: a tensor has 0..%d dims, not %d", SHARD_MAX_DIMS,
                           tensor_ndim);
    shard_spec spec = shard_spec_replicated(tensor_ndim);
    parser ps = {text, text, layout, &spec, 0, 0, 0};
    if (!accept(&ps, "P") || !accept(&ps, "(")) return fail(&ps, "a spec starts with P(", NULL);
    int entries = 0, keywords = 0;
    while (!accept(&ps, ")")) {
        if ((entries || keywords) && !accept(&ps, ",")) return fail(&ps, "expected ',' or ')'", NULL);
        if (accept(&ps, ")")) break;
        if (accept(&ps, "partial_op")) {
            char op[16];
            if (!accept(&ps, "=")) return fail(&ps, "expected '=' after partial_op", NULL);
            SHARD_CHECK(parse_string(&ps, op, sizeof op));
            if (shard_reduce_op_parse(op, &spec.partial_op) < 0 || spec.partial_op == SHARD_OP_PROD)
                return fail(&ps, "partial_op '%s' is invalid: give sum, max, min or avg", op);
            keywords++;
        } else if (accept(&ps, "partial")) {
            int8_t axes[SHARD_MESH_MAX_AXES];
            int n = 0;
            if (!accept(&ps, "=")) return fail(&ps, "expected '=' after partial", NULL);
            ps.in_partial = 1;
            SHARD_CHECK(parse_axes(&ps, axes, &n, 0));
            ps.in_partial = 0;
            for (int i = 0; i < n; i++) spec.partial_mask |= 1u << axes[i];
            keywords++;
        } else {
            if (keywords) return fail(&ps, "dim entries come before partial= and partial_op=", NULL);
            if (entries == tensor_ndim) {
                char detail[64];
                snprintf(detail, sizeof detail, "%d", tensor_ndim);
                return fail(&ps, "more entries than the tensor's %s dims", detail);
            }
            if (!accept(&ps, "None")) SHARD_CHECK(parse_axes(&ps, spec.axes[entries], &spec.naxes[entries], 1));
            entries++;
        }
    }
    skip_space(&ps);
    if (*ps.p) return fail(&ps, "unexpected text after the closing ')'", NULL);
    *out = spec;
    return SHARD_OK;
}

/* ---------------------------------------------------------------- printing */

static size_t put_axes(char *out, size_t out_bytes, const int8_t *axes, int n, const shard_mesh_layout *layout,
                       const char *quote) {
    size_t used = 0;
    if (n == 1) return (size_t)snprintf(out, out_bytes, "%s%s%s", quote, layout->names[axes[0]], quote);
    used += (size_t)snprintf(out, out_bytes, "(");
    for (int i = 0; i < n && used < out_bytes; i++)
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%s%s%s", i ? "," : "", quote, layout->names[axes[i]],
                                 quote);
    if (used < out_bytes) used += (size_t)snprintf(out + used, out_bytes - used, ")");
    return used;
}

static int mask_axes(unsigned mask, int8_t *axes) {
    int n = 0;
    for (int k = 0; k < SHARD_MESH_MAX_AXES; k++)
        if (mask & (1u << k)) axes[n++] = (int8_t)k;
    return n;
}

void shard_spec_string(const shard_spec *spec, const shard_mesh_layout *layout, char *out, size_t out_bytes) {
    size_t used = (size_t)snprintf(out, out_bytes, "P(");
    for (int d = 0; d < spec->ndim && used < out_bytes; d++) {
        if (d) used += (size_t)snprintf(out + used, out_bytes - used, ", ");
        if (used >= out_bytes) break;
        if (spec->naxes[d] == 0)
            used += (size_t)snprintf(out + used, out_bytes - used, "None");
        else
            used += put_axes(out + used, out_bytes - used, spec->axes[d], spec->naxes[d], layout, "'");
    }
    if (spec->partial_mask && used < out_bytes) {
        int8_t axes[SHARD_MESH_MAX_AXES];
        int n = mask_axes(spec->partial_mask, axes);
        used += (size_t)snprintf(out + used, out_bytes - used, "%spartial=", spec->ndim ? ", " : "");
        if (used < out_bytes) used += put_axes(out + used, out_bytes - used, axes, n, layout, "'");
        if (spec->partial_op != SHARD_OP_SUM && used < out_bytes)
            used += (size_t)snprintf(out + used, out_bytes - used, ", partial_op='%s'",
                                     shard_reduce_op_name(spec->partial_op));
    }
    if (used < out_bytes) snprintf(out + used, out_bytes - used, ")");
}

void shard_spec_type_string(const shard_spec *spec, const shard_mesh_layout *layout, shard_dtype dtype,
                            const size_t *global_shape, char *out, size_t out_bytes) {
    size_t used = (size_t)snprintf(out, out_bytes, "%s[", shard_dtype_name(dtype));
    for (int d = 0; d < spec->ndim && used < out_bytes; d++) {
        used += (size_t)snprintf(out + used, out_bytes - used, "%s%zu", d ? "," : "", global_shape[d]);
        if (spec->naxes[d] && used < out_bytes) {
            used += (size_t)snprintf(out + used, out_bytes - used, "@");
            if (used < out_bytes)
                used += put_axes(out + used, out_bytes - used, spec->axes[d], spec->naxes[d], layout, "");
        }
    }
    if (used < out_bytes) used += (size_t)snprintf(out + used, out_bytes - used, "]");
    if (spec->partial_mask && used < out_bytes) {
        int8_t axes[SHARD_MESH_MAX_AXES];
        int n = mask_axes(spec->partial_mask, axes);
        used +=
            (size_t)snprintf(out + used, out_bytes - used, " partial %s over ", shard_reduce_op_name(spec->partial_op));
        if (used < out_bytes) put_axes(out + used, out_bytes - used, axes, n, layout, "");
    }
}

/* ---------------------------------------------------------------- placement */

int shard_spec_pieces(const shard_spec *spec, const shard_mesh_layout *layout, int dim) {
    int pieces = 1;
    for (int i = 0; i < spec->naxes[dim]; i++) pieces *= layout->sizes[spec->axes[dim][i]];
    return pieces;
}

int shard_spec_piece_index(const shard_spec *spec, const shard_mesh_layout *layout, int dim, const int *coords) {
    int index = 0;
    for (int i = 0; i < spec->naxes[dim]; i++) {
        int k = spec->axes[dim][i];
        index = index * layout->sizes[k] + coords[k];
    }
    return index;
}

void shard_split_range(size_t count, int pieces, int index, size_t *offset, size_t *length) {
    shard_split_even(count, (size_t)pieces, (size_t)index, offset, length);
}

void shard_spec_local_range(const shard_spec *spec, const shard_mesh_layout *layout, const size_t *global_shape,
                            const int *coords, int dim, size_t *offset, size_t *length) {
    size_t off = 0, len = global_shape[dim]; /* split over the first axis, then each piece over the next */
    for (int i = 0; i < spec->naxes[dim]; i++) {
        int k = spec->axes[dim][i];
        size_t sub_off, sub_len;
        shard_split_range(len, layout->sizes[k], coords[k], &sub_off, &sub_len);
        off += sub_off, len = sub_len;
    }
    *offset = off, *length = len;
}

shard_status shard_spec_check_dtype(const shard_spec *s, shard_dtype dtype, const char *what) {
    if (s->partial_mask && s->partial_op == SHARD_OP_AVG && !shard_dtype_is_float(dtype))
        return shard_error(SHARD_ERR_INVALID_ARG,
                           "%s: a pending avg of %s would wrap its sum before dividing; give "
                           "partial_op sum, max or min for integer dtypes",
                           what, shard_dtype_name(dtype));
    return SHARD_OK;
}

shard_status shard_spec_validate(const shard_spec *s, const shard_mesh_layout *layout, int ndim, const char *what) {
    unsigned seen = 0;
    if (layout->ndim < 0 || layout->ndim > SHARD_MESH_MAX_AXES)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: a mesh of %d axes (0..%d are possible)", what, layout->ndim,
                           SHARD_MESH_MAX_AXES);
    for (int k = 0; k < layout->ndim; k++)
        if (layout->sizes[k] < 1)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s: mesh axis '%s' has size %d (sizes are >= 1)", what,
                               layout->names[k], layout->sizes[k]);
    if (ndim < 0 || ndim > SHARD_MAX_DIMS)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s: a tensor of %d dims (0..%d are possible)", what, ndim,
                           SHARD_MAX_DIMS);
    if (s->ndim != ndim)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s has %d dims, the tensor %d", what, s->ndim, ndim);
    for (int d = 0; d < ndim; d++) {
        if (s->naxes[d] < 0 || s->naxes[d] > layout->ndim)
            return shard_error(SHARD_ERR_INVALID_ARG, "%s splits dim %d over %d axes; the mesh has %d", what, d,
                               s->naxes[d], layout->ndim);
        for (int i = 0; i < s->naxes[d]; i++) {
            int k = s->axes[d][i];
            if (k < 0 || k >= layout->ndim)
                return shard_error(SHARD_ERR_INVALID_ARG,
                                   "%s splits dim %d over axis index %d; the mesh's axes are 0..%d", what, d, k,
                                   layout->ndim - 1);
            if (seen & (1u << k))
                return shard_error(SHARD_ERR_INVALID_ARG, "%s uses axis '%s' twice", what, layout->names[k]);
            seen |= 1u << k;
        }
    }
    if (s->partial_mask >> layout->ndim)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s is partial over axis index %d; the mesh has %d axes", what,
                           31 - __builtin_clz(s->partial_mask), layout->ndim);
    for (int k = 0; k < layout->ndim; k++)
        if (s->partial_mask & seen & (1u << k))
            return shard_error(SHARD_ERR_INVALID_ARG, "%s is partial over axis '%s', which also splits a dim", what,
                               layout->names[k]);
    if (s->partial_mask && s->partial_op != SHARD_OP_SUM && s->partial_op != SHARD_OP_MAX &&
        s->partial_op != SHARD_OP_MIN && s->partial_op != SHARD_OP_AVG)
        return shard_error(SHARD_ERR_INVALID_ARG, "%s's pending reduction is '%s'; valid: sum, max, min, avg", what,
                           shard_reduce_op_name(s->partial_op));
    return SHARD_OK;
}
