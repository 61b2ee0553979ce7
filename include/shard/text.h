/* text.h — what messages say about text a person typed: the valid word nearest a mistyped one (a
 * did-you-mean for verbs, options, mesh axes and config keys alike), and the characters a terminal
 * does not show (a byte-order mark, a no-break space, control characters) named by their code, so
 * that "key 'n_embd' is unknown" never stands next to a key that reads exactly n_embd. */
#ifndef SHARD_TEXT_H
#define SHARD_TEXT_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The edits (insert, delete, replace one byte, or swap two neighbours) that turn a into b, ASCII
 * letters compared without case.  Words of up to 255 bytes; a longer one counts as far from all. */
size_t shard_text_distance(const char *a, const char *b);

/* The candidate a mistyped word most likely meant, or NULL when none is near enough to suggest: the
 * nearest within 1 edit for words of up to 4 bytes, 2 up to 8, 3 beyond ("trian" -> "train",
 * "n_embed" -> "n_embd"); else the one candidate the word begins (a prefix of 2 bytes or more), or,
 * for a word of at most 3 bytes, the one candidate sharing its first letter (an abbreviation:
 * "dp" -> "data", "tp" -> "tensor").  A word equal to a candidate is not a mistake: NULL. */
const char *shard_text_nearest(const char *word, const char *const *candidates, size_t count);

/* text with every character a terminal would not show written as its code and name in brackets,
 * "[U+FEFF (a byte-order mark)]", "[U+00A0 (a no-break space)]", "[U+0009 (a tab)]", and a byte
 * that is not UTF-8 as "[byte 0xff (not UTF-8)]", into out (cut short to fit, whole characters).
 * Returns how many such characters there were (0: out is text unchanged). */
size_t shard_text_show_invisible(const char *text, char *out, size_t out_bytes);

#ifdef __cplusplus
}
#endif
#endif
