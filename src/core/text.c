/* text.c — the did-you-mean and the invisible characters of text.h.
 *
 * One distance serves every place a word is looked up (verbs, options, mesh axes, config keys), so a
 * typo is answered the same way wherever it is made.  The invisible characters are named in the error
 * text itself (shard_error renders them), because a message quoting a key or a path that holds one
 * would otherwise print exactly the name the reader believes they typed. */
#include "shard/text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { MOST_WORD_BYTES = 255 };

static unsigned char fold(unsigned char c) { return c >= 'A' && c <= 'Z' ? (unsigned char)(c - 'A' + 'a') : c; }

/* Optimal string alignment: Levenshtein plus the swap of two neighbours ("trian"), three rows kept. */
size_t shard_text_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > MOST_WORD_BYTES || m > MOST_WORD_BYTES) return SIZE_MAX;
    size_t rows[3][MOST_WORD_BYTES + 1], *back = rows[0], *prev = rows[1], *cur = rows[2];
    for (size_t j = 0; j <= m; j++) prev[j] = j;
    for (size_t i = 1; i <= n; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= m; j++) {
            unsigned char x = fold((unsigned char)a[i - 1]), y = fold((unsigned char)b[j - 1]);
            size_t best = prev[j - 1] + (x != y);
            if (prev[j] + 1 < best) best = prev[j] + 1;
            if (cur[j - 1] + 1 < best) best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && x == fold((unsigned char)b[j - 2]) && fold((unsigned char)a[i - 2]) == y &&
                back[j - 2] + 1 < best)
                best = back[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = back;
        back = prev, prev = cur, cur = t;
    }
    return prev[m];
}

const char *shard_text_nearest(const char *word, const char *const *candidates, size_t count) {
    if (!word || !*word || !candidates) return NULL;
    size_t len = strlen(word), limit = len <= 4 ? 1 : len <= 8 ? 2 : 3, best_d = SIZE_MAX;
    const char *best = NULL, *prefix_of = NULL, *initial_of = NULL;
    size_t prefixes = 0, initials = 0;
    for (size_t i = 0; i < count; i++) {
        const char *c = candidates[i];
        if (!c) continue;
        if (strcmp(word, c) == 0) return NULL;
        size_t d = shard_text_distance(word, c);
        if (d <= limit && d < best_d) best = c, best_d = d;
        if (len >= 2 && strlen(c) > len && strncmp(word, c, len) == 0) prefix_of = c, prefixes++;
        if (fold((unsigned char)c[0]) == fold((unsigned char)word[0])) initial_of = c, initials++;
    }
    if (best) return best;
    if (prefixes == 1) return prefix_of;
    return len <= 3 && initials == 1 ? initial_of : NULL;
}

/* The code point at s (its byte count in *bytes), or -1 for a byte that does not start valid UTF-8
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static long decode(const unsigned char *s, size_t *bytes) {
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 9;
    *bytes = 1;
    if (n == 9) return -1;
    long cp = n == 0 ? c : n == 1 ? (c & 0x1F) : n == 2 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k <= n; k++) {
        if ((s[k] & 0xC0) != 0x80) return -1; /* the NUL that ends the text stops here too */
        cp = (cp << 6) | (s[k] & 0x3F);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return -1;
    *bytes = n + 1;
    return cp;
}

/* The name of a character a terminal does not show, or NULL for one it does. */
static const char *invisible_name(long cp) {
    static const struct {
        long first, last;
        const char *name;
    } table[] = {
        {0x09, 0x09, "a tab"},
        {0x0A, 0x0A, "a line feed"},
        {0x0D, 0x0D, "a carriage return"},
        {0x1B, 0x1B, "an escape"},
        {0x00, 0x1F, "a control character"},
        {0x7F, 0x7F, "a delete control character"},
        {0x80, 0x9F, "a C1 control character"},
        {0xA0, 0xA0, "a no-break space"},
        {0xAD, 0xAD, "a soft hyphen"},
        {0x34F, 0x34F, "a combining grapheme joiner"},
        {0x61C, 0x61C, "an Arabic letter mark"},
        {0x180E, 0x180E, "a Mongolian vowel separator"},
        {0x2000, 0x200A, "a typographic space"},
        {0x200B, 0x200B, "a zero-width space"},
        {0x200C, 0x200C, "a zero-width non-joiner"},
        {0x200D, 0x200D, "a zero-width joiner"},
        {0x200E, 0x200F, "a direction mark"},
        {0x2028, 0x2028, "a line separator"},
        {0x2029, 0x2029, "a paragraph separator"},
        {0x202A, 0x202E, "a bidirectional control"},
        {0x202F, 0x202F, "a narrow no-break space"},
        {0x205F, 0x205F, "a medium mathematical space"},
        {0x2060, 0x2060, "a word joiner"},
        {0x2061, 0x2064, "an invisible operator"},
        {0x2066, 0x2069, "a bidirectional isolate"},
        {0x3000, 0x3000, "an ideographic space"},
        {0xFEFF, 0xFEFF, "a byte-order mark"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (cp >= table[i].first && cp <= table[i].last) return table[i].name;
    return NULL;
}

size_t shard_text_show_invisible(const char *text, char *out, size_t out_bytes) {
    size_t found = 0, at = 0;
    if (!out || !out_bytes) return 0;
    out[0] = '\0';
    if (!text) return 0;
    for (const unsigned char *p = (const unsigned char *)text; *p;) {
        size_t bytes;
        long cp = decode(p, &bytes);
        const char *name = cp < 0 ? NULL : invisible_name(cp);
        char piece[64];
        size_t n = bytes;
        if (cp < 0)
            n = (size_t)snprintf(piece, sizeof piece, "[byte 0x%02x (not UTF-8)]", p[0]);
        else if (name)
            n = (size_t)snprintf(piece, sizeof piece, "[U+%04lX (%s)]", (unsigned long)cp, name);
        else
            memcpy(piece, p, bytes);
        if (cp < 0 || name) found++;
        if (at + n < out_bytes)
            memcpy(out + at, piece, n), at += n; /* whole pieces only */
        else
            out_bytes = at + 1; /* full: count the rest, write nothing */
        p += bytes;
    }
    out[at] = '\0';
    return found;
}
