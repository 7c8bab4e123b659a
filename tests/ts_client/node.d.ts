// The little of Node.js the test uses (the test pins no @types/node).
declare const process: {
  argv: string[];
  exitCode: number | undefined;
  exit(code?: number): never;
};

declare module "node:fs" {
  export function readFileSync(path: string, encoding: "utf8"): string;
}
