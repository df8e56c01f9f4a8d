# llmtap as a shared gateway: see docker-compose.yml and docs/team.md.
FROM python:3.11-slim
RUN useradd --create-home --uid 10001 llmtap && mkdir /data && chown llmtap /data
WORKDIR /app
COPY pyproject.toml README.md ./
COPY requirements/lock.txt ./requirements/
COPY proxy ./proxy
COPY analysis ./analysis
# the otel and s3 extras: OpenTelemetry export is one setting away, `llmtap export --out s3://...` works;
# at the releases the suite ran on (requirements/lock.txt), so an image built later gets the same
RUN pip install --no-cache-dir -c requirements/lock.txt ".[otel,s3]"
USER llmtap
ENV LLMTAP_HOME=/data
VOLUME /data
EXPOSE 8787
# The admin endpoint always asks for its token: $LLMTAP_ADMIN_TOKEN (docker-compose.yml sets it).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["python", "-c", "import os, urllib.request as u; t = os.environ.get('LLMTAP_ADMIN_TOKEN'); u.build_opener(u.ProxyHandler({})).open(u.Request('http://127.0.0.1:8787/_llmtap/health', headers={'X-Llmtap-Admin-Token': t} if t else {}), timeout=4)"]
ENTRYPOINT ["llmtap"]
CMD ["serve", "--host", "0.0.0.0", "--allow-remote"]
