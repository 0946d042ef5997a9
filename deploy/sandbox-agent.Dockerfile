# A Keel sandbox host: `keel sandbox-agent` driving the host's Docker engine through its socket.
# Build from the repository root: docker build -f deploy/sandbox-agent.Dockerfile -t keel/sandbox-agent .
FROM node:20-bookworm-slim
WORKDIR /opt/keel
ENV NODE_ENV=production
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY bin ./bin
COPY common ./common
COPY control-plane/src ./control-plane/src
COPY sandbox-agent ./sandbox-agent
COPY gen ./gen
COPY tsconfig.json ./
# The agent talks to the engine through /var/run/docker.sock (mounted); workspaces themselves run
# as an unprivileged user with no capabilities (docs/security.md). Its state lives in /var/lib/keel-sandbox.
VOLUME /var/lib/keel-sandbox
ENTRYPOINT ["node", "bin/keel.js", "sandbox-agent"]
CMD ["--backend", "docker", "--data-dir", "/var/lib/keel-sandbox"]
