"""`bonsai fleet`: llama-server replicas (local, and remote hosts from a fleet file) behind the
LiteLLM proxy; `bonsai export`: a profile as a vLLM/SGLang command line.

Modules, one job each:
- hosts: the fleet file (remote members) and how local replicas share GPUs or cores (pure);
- configs: the LiteLLM and llama-swap configurations (pure);
- state: what `fleet up` started, on disk, for `fleet ps` and `fleet down`;
- proxy: the LiteLLM proxy process (spawn, wait ready, stop);
- probe: one member's health, in-flight requests and speculative acceptance;
- members: what `fleet up` is asked for; local replicas (each a detached `bonsai start`,
  registered for `bonsai ps`) and remote hosts, and waiting until each answers;
- service: up, ps and down: members, configurations and the proxy together;
- latency: what the proxy adds per request (run in a quiet window);
- export: vLLM/SGLang command lines.
"""
