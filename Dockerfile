# Placeholder: the agent image (Claude Code and Codex at pinned versions, non-root user)
# comes with the Docker sandbox. Its base image will be a build argument so that it builds
# offline from a locally imported base.
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN useradd --create-home --uid 1000 agent
USER agent
WORKDIR /workspace
