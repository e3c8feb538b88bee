/* Prints --help, --version and --list-devices in llama-server's b11434 formats. */
#include <stdio.h>
#include <string.h>

static const char *HELP =
    "----- common params -----\n"
    "\n"
    "-h,    --help, --usage                  print usage and exit\n"
    "--version                               show version and build info\n"
    "--list-devices                          print list of available devices and exit\n"
    "-c,    --ctx-size N                     size of the prompt context (default: 0, 0 = loaded from model)\n"
    "                                        (env: LLAMA_ARG_CTX_SIZE)\n"
    "-m,    --model FNAME                    model path to load\n"
    "\n"
    "----- speculative params -----\n"
    "\n"
    "-md,   --spec-draft-model FNAME         draft model for speculative decoding (default: unused)\n"
    "--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)\n"
    "--spec-type none,draft-simple,draft-dflash,draft-dspark,ngram-simple\n"
    "                                        comma-separated list of types of speculative decoding to use (default:\n"
    "                                        none)\n"
    "--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or\n"
    "                                        --spec-ngram-mod-n-max\n"
    "\n"
    "----- example-specific params -----\n"
    "\n"
    "--host HOST                             ip address to listen on (default: 127.0.0.1)\n"
    "--port PORT                             port to listen (default: 8080)\n";

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fprintf(stderr, "version: 0.6.0-dev (build %d, commit unknown)\nbuilt with fake cc\n", BUILD_NUMBER);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--list-devices") == 0) {
        printf("Available devices:\n  (none)\n");
        return 0;
    }
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        fputs(HELP, stdout);
        return 0;
    }
    fprintf(stderr, "fake llama-server: nothing to serve\n");
    return 1;
}
