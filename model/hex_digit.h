/* hex_digit — the value of one hexadecimal digit, either case, or -1 for any other byte.
 * One rule for every reader of a hex escape: SentencePiece's <0xHH> byte pieces, a regex's
 * \xHH \uHHHH \UHHHHHHHH, JSON's \uHHHH and a $ref's %HH. Header only: a few lines that
 * inline into their parsers. */
#ifndef PAGEDSERVE_MODEL_HEX_DIGIT_H
#define PAGEDSERVE_MODEL_HEX_DIGIT_H

static inline int hex_digit(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

#endif
