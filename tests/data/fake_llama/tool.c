#include <stdio.h>
int main(void) { puts("fake llama tool"); return 0; }
