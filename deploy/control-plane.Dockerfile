# The Keel control plane: `keel serve` against an external PostgreSQL (DATABASE_URL).
# Build from the repository root: docker build -f deploy/control-plane.Dockerfile -t keel/control-plane .
FROM node:20-bookworm-slim
WORKDIR /opt/keel
ENV NODE_ENV=production
COPY package.json package-lock.json ./
# tsx runs the TypeScript sources directly; dev tools (test, lint, bench peers) are left out.
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY bin ./bin
COPY common ./common
COPY control-plane/src ./control-plane/src
COPY gen ./gen
COPY proto ./proto
COPY proto-vendor ./proto-vendor
COPY tsconfig.json ./
USER node
# Listen on every interface inside the container; TLS files are mounted (see docker-compose.yml).
ENV KEEL_HOST=0.0.0.0 KEEL_PORT=7070 KEEL_HTTP1_PORT=7071
EXPOSE 7070 7071
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "bin/keel.js", "health"]
ENTRYPOINT ["node", "bin/keel.js"]
CMD ["serve"]
