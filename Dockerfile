# The agent image of durable-harness's Docker sandbox: Node.js, the agent CLIs at the
# versions pinned in tools/npm/package-lock.json (the one place they are pinned), a
# non-root user with uid 1000, /workspace. Hardening (read-only root, no capabilities,
# no network, limits) is applied when the sandbox creates a container: docs/docker.md.
#
# Online, with any Docker that can pull the base:
#   docker build -t durable-harness/agent:0.1.0 .       (or: durable-harness sandbox build)
# Offline (no registry; base made with debootstrap, CLIs installed by the host's npm):
#   durable-harness sandbox build --offline
#
# BASE must provide Debian (bookworm) userland, bash, coreutils, tar and node >= 20.
ARG BASE=node:20-bookworm-slim
FROM ${BASE}
USER root

# git and ps for the agents. The offline base has them, so nothing is downloaded there.
RUN if ! command -v git >/dev/null || ! command -v ps >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends git procps ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# uid 1000 is the agent (node images already name it "node"; the name does not matter).
RUN (getent passwd 1000 >/dev/null \
      || useradd --uid 1000 --user-group --home-dir /home/agent --no-create-home \
           --shell /bin/bash agent) \
    && mkdir -p /home/agent /workspace \
    && chown 1000:1000 /home/agent /workspace

# node_modules is already in the build context when an offline build installed the
# CLIs on the host; otherwise npm installs them here from the lock file (`npm install`: `npm ci` refuses
# a lock without the other platforms' optional binaries, which npm leaves out). Owned by root,
# so the agent cannot change its own CLIs (no chmod here: it would copy ~800 MB into a
# new layer).
COPY tools/npm/ /opt/agent-clis/
RUN cd /opt/agent-clis \
    && if [ ! -d node_modules ]; then \
         npm install --omit=dev --no-audit --no-fund && npm cache clean --force; \
       fi

ENV HOME=/home/agent \
    PATH=/opt/agent-clis/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    TERM=dumb \
    PAGER=cat \
    GIT_PAGER=cat \
    GIT_TERMINAL_PROMPT=0 \
    DISABLE_AUTOUPDATER=1 \
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1

USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
