"""`bonsai fleet`: llama-server replicas (local, and remote hosts from a fleet file) behind the
LiteLLM proxy; `bonsai export`: a profile as a vLLM/SGLang command line.

Modules, one job each:
- hosts: the fleet file (remote members) and how local replicas share GPUs or cores (pure);
- configs: the LiteLLM and llama-swap configurations (pure);
- state: what `fleet up` started, on disk, for `fleet ps` and `fleet down`;
- proxy: the LiteLLM proxy process (spawn, wait ready, stop);
- probe: one member's health, in-flight requests and speculative acceptance;
- service: up, ps and down, over the existing supervisor (each replica is a detached
  `bonsai start`, registered for `bonsai ps`);
- latency: what the proxy adds per request (run in a quiet window);
- export: vLLM/SGLang command lines.
"""
